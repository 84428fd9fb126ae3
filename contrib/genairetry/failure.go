package genairetry

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmretry/llmretry"
	"google.golang.org/genai"
)

// Failure maps an error from google.golang.org/genai to the chain's
// terms, and is what the Backends of this package apply to every error
// of the SDK. It returns nil for nil.
//
// A genai.APIError (an error response, or an error inside a stream)
// becomes a *llmretry.Failure with the error's HTTP code as its Status,
// and a cause that unwraps to the genai.APIError and whose message gives
// Google's status name and message, passed through [llmretry.Redact]:
//
//	genairetry: UNAVAILABLE: The model is overloaded. Please try again later.
//
// Its Kind comes from the status name: RESOURCE_EXHAUSTED, UNAVAILABLE,
// INTERNAL and DEADLINE_EXCEEDED are transient; INVALID_ARGUMENT (a
// prompt too long for the model among them), FAILED_PRECONDITION,
// UNAUTHENTICATED, PERMISSION_DENIED and NOT_FOUND are rejected; any
// other is classified by its code ([llmretry.ClassifyStatus]). The
// RetryAfter of a RESOURCE_EXHAUSTED is the google.rpc.RetryInfo
// retryDelay of its details ("22s").
//
// A RESOURCE_EXHAUSTED whose google.rpc.QuotaFailure names a quota per
// day (its quotaId or quotaMetric says "PerDay" or "per_day") is rejected
// instead, without a RetryAfter: the quota comes back the next day, so
// no retry within the call can help, and the chain goes on to the next
// backend at once. Its cause says so, and is a [*DailyQuota].
//
// An error the SDK raises for a response body or a stream event it could
// not decode is a transient failure: another try may read a whole one.
// Any other error
// (a refused connection, a timeout, a context error, an error already
// mapped) is returned unchanged: [llmretry.Classify] knows those.
func Failure(err error) error {
	if err == nil {
		return nil
	}
	return mapAPIError(err, nil)
}

// mapError maps an error of a Backend's call, with what the Transport
// saw of the response and the text received before it.
func mapError(ctx context.Context, err error, s *seen, text string) error {
	err = causeOf(ctx, err)
	var header http.Header
	if s != nil {
		header = s.get()
	}
	mapped := mapAPIError(err, header)
	var f *llmretry.Failure
	if !errors.As(mapped, &f) {
		if text == "" {
			// Nothing to carry: the chain classifies the error itself,
			// and the record reads as that of any adapter's request cut
			// the same way, "llmretry: attempt timeout" for one.
			return mapped
		}
		// A transport error: classify it now, as the chain would have,
		// so that it can carry the text.
		f = &llmretry.Failure{Kind: llmretry.Classify(mapped), Err: mapped}
	}
	if text != "" {
		f.RawText = &text
	}
	return f
}

// mapAPIError is [Failure] with the response's header when it is known.
func mapAPIError(err error, header http.Header) error {
	var mapped *llmretry.Failure
	if errors.As(err, &mapped) {
		return err
	}
	apiErr, ok := asAPIError(err)
	if !ok {
		if undecodable(err) {
			return &llmretry.Failure{Kind: llmretry.KindTransient, Err: &malformed{err: err}}
		}
		return err
	}
	cause := &apiError{err: apiErr}
	f := llmretry.StatusFailure(apiErr.Code, header, cause)
	switch apiErr.Status {
	case "RESOURCE_EXHAUSTED":
		if q := dailyQuota(apiErr.Details); q != nil {
			cause.daily = q
			f.Kind = llmretry.KindRejected
			f.RetryAfter = 0
			break
		}
		f.Kind = llmretry.KindTransient
		// Both the header and the body may say when; waiting less than
		// either would be early.
		f.RetryAfter = max(f.RetryAfter, retryDelay(apiErr.Details))
	case "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED":
		f.Kind = llmretry.KindTransient
	case "INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND":
		f.Kind = llmretry.KindRejected
	}
	return f
}

// undecodable reports whether err is the SDK's report of a response body
// or a stream event it could not decode: a JSON decoding error it
// wrapped, or the untyped error it gives a stream line that is neither
// data nor an error object. Its other errors, such as a request it could
// not build, are not, and are left to [llmretry.Classify].
func undecodable(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ) ||
		strings.HasPrefix(err.Error(), "iterateResponseStream: invalid stream chunk")
}

// asAPIError finds the SDK's error, which it returns as a value.
func asAPIError(err error) (genai.APIError, bool) {
	var v genai.APIError
	if errors.As(err, &v) {
		return v, true
	}
	var p *genai.APIError
	if errors.As(err, &p) && p != nil {
		return *p, true
	}
	return genai.APIError{}, false
}

// causeOf returns why ctx ended when err came of its ending. The SDK
// returns the bare context error, wrapped, and "context canceled" would
// hide that the chain's StallTimeout or Timeout ended the attempt, or
// what the caller gave as the cause.
func causeOf(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
	}
	return err
}

// detailType is the type of a google.rpc detail, the part of its "@type"
// after the last '/' ("google.rpc.RetryInfo").
func detailType(d map[string]any) string {
	t, _ := d["@type"].(string)
	return t[strings.LastIndex(t, "/")+1:]
}

// retryDelay is the RetryInfo's retryDelay among details, 0 when there
// is none or it does not read as a duration in seconds ("22s", "1.5s").
func retryDelay(details []map[string]any) time.Duration {
	for _, d := range details {
		if detailType(d) != "google.rpc.RetryInfo" {
			continue
		}
		s, _ := d["retryDelay"].(string)
		secs, ok := strings.CutSuffix(s, "s")
		if !ok {
			return 0
		}
		f, err := strconv.ParseFloat(secs, 64)
		// A day bounds it: a larger delay is no hint a call can use, and
		// the bound keeps the conversion from overflowing.
		if err != nil || f <= 0 || f > 24*60*60 {
			return 0
		}
		return time.Duration(f * float64(time.Second))
	}
	return 0
}

// dailyQuota is the first per-day quota a QuotaFailure among details
// names, nil when none does.
func dailyQuota(details []map[string]any) *DailyQuota {
	for _, d := range details {
		if detailType(d) != "google.rpc.QuotaFailure" {
			continue
		}
		violations, _ := d["violations"].([]any)
		for _, v := range violations {
			m, _ := v.(map[string]any)
			id, _ := m["quotaId"].(string)
			metric, _ := m["quotaMetric"].(string)
			if perDay(id) || perDay(metric) {
				return &DailyQuota{QuotaID: id, QuotaMetric: metric}
			}
		}
	}
	return nil
}

func perDay(s string) bool {
	return strings.Contains(s, "PerDay") || strings.Contains(strings.ToLower(s), "per_day")
}

// DailyQuota is a quota per day that a Gemini 429 said was spent: the
// cause, under a rejected [*llmretry.Failure], of an attempt that no
// retry within the call can make good. Find it in an attempt's record
// with errors.As.
type DailyQuota struct {
	QuotaID     string // the quota's id, as "GenerateRequestsPerDayPerProjectPerModel-FreeTier"; may be empty
	QuotaMetric string // the metric it counts, as "generativelanguage.googleapis.com/generate_content_free_tier_requests"; may be empty
}

// Error names the quota and says why the chain did not retry.
func (q *DailyQuota) Error() string {
	name := q.QuotaID
	if name == "" {
		name = q.QuotaMetric
	}
	return "genairetry: daily quota " + name + " is spent; retrying within the call cannot help"
}

// apiError is the cause of a mapped API error: a one-line message with
// what Google said, redacted, over the SDK's own error, whose message
// holds every detail.
type apiError struct {
	err   genai.APIError
	daily *DailyQuota // a spent daily quota, nil for any other error
}

func (e *apiError) Error() string {
	var b strings.Builder
	b.WriteString("genairetry: ")
	if e.err.Status != "" {
		b.WriteString(e.err.Status)
	} else {
		b.WriteString("error")
	}
	msg := e.err.Message
	if msg == "" {
		msg = http.StatusText(e.err.Code)
	}
	if msg != "" {
		b.WriteString(": ")
		b.WriteString(oneLine(msg))
	}
	if e.daily != nil {
		b.WriteString(" (")
		b.WriteString(strings.TrimPrefix(e.daily.Error(), "genairetry: "))
		b.WriteString(")")
	}
	// Providers echo what they were sent, keys and URLs among it.
	return llmretry.Redact(b.String())
}

// Unwrap returns the SDK's error, for errors.As to genai.APIError, and
// the spent daily quota when there is one.
func (e *apiError) Unwrap() []error {
	if e.daily != nil {
		return []error{e.err, e.daily}
	}
	return []error{e.err}
}

// malformed is a response or stream event the SDK could not decode. Its
// message leaves out the SDK's, which quotes the undecoded body: the
// model's text, at any length.
type malformed struct{ err error }

func (e *malformed) Error() string { return "genairetry: malformed response from the server" }

// Unwrap returns the SDK's error.
func (e *malformed) Unwrap() error { return e.err }

// oneLine keeps a provider's message to one line, as our errors are.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
