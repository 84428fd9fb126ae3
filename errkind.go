package llmretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kind says how an attempt failed, and so what the chain does next: try
// the same backend again, fail over to the next one, or stop. The zero
// Kind is [KindUnknown].
type Kind uint8

const (
	// KindUnknown is an error nothing recognised. It is not retried in its
	// backend; the chain fails over to the next one.
	KindUnknown Kind = iota
	// KindTransient is a failure that may pass: HTTP 408, 425, 429 or 5xx,
	// a refused, reset or aborted connection, a broken pipe, a failed dial,
	// or an EOF or unexpected EOF from the server.
	KindTransient
	// KindTimeout is an attempt that hit a deadline: the backend's Timeout
	// or StallTimeout, a net.Error whose Timeout() is true, or
	// context.DeadlineExceeded.
	KindTimeout
	// KindTruncated is a model that stopped at its completion budget
	// (finish_reason "length"). The same request to the same backend would
	// stop at the same place, so it fails over.
	KindTruncated
	// KindParse is a model that answered with output that could not be
	// used. Sampling differs between tries, so it is retried.
	KindParse
	// KindRejected is any other 4xx: this backend would answer the same
	// again, so the chain fails over.
	KindRejected
	// KindCancelled is the caller withdrawing. It ends the chain at once
	// with a [Cancelled].
	KindCancelled
	// KindRefused is a provider that refused the content: a content
	// filter, a safety block, a refusal stop reason (see [Refusal]). The
	// same request would be refused again, and another provider's filter
	// may be weaker, so by default it ends the chain with the provider's
	// reason rather than failing over ([Chain.FailOverRefused] lets it
	// fail over). It is not retried.
	KindRefused
)

var kindNames = [...]string{
	KindUnknown:   "unknown",
	KindTransient: "transient",
	KindTimeout:   "timeout",
	KindTruncated: "truncated",
	KindParse:     "parse",
	KindRejected:  "rejected",
	KindCancelled: "cancelled",
	KindRefused:   "refused",
}

// String returns the Kind's lowercase name, such as "transient", or
// "kind(9)" for a value outside the declared constants.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Retryable reports whether a failure of this Kind may be tried again in
// the same backend: true for [KindTransient], [KindTimeout] and
// [KindParse].
func (k Kind) Retryable() bool {
	return k == KindTransient || k == KindTimeout || k == KindParse
}

// MarshalText encodes the Kind as its [Kind.String] name, so Kinds read
// well in JSON and in logs. A value outside the constants (a custom
// Chain.Classify may return one) encodes as "kind(N)" and decodes back.
func (k Kind) MarshalText() ([]byte, error) {
	return []byte(k.String()), nil
}

// UnmarshalText decodes a name written by [Kind.MarshalText]. An
// unrecognised name is an error and leaves k unchanged.
func (k *Kind) UnmarshalText(text []byte) error {
	for i, name := range kindNames {
		if string(text) == name {
			*k = Kind(i)
			return nil
		}
	}
	if digits, ok := strings.CutPrefix(string(text), "kind("); ok {
		if digits, ok := strings.CutSuffix(digits, ")"); ok {
			if n, err := strconv.ParseUint(digits, 10, 8); err == nil {
				*k = Kind(n)
				return nil
			}
		}
	}
	return fmt.Errorf("llmretry: unknown kind %q", text)
}

// ClassifyStatus maps an HTTP status code to a Kind: 408, 425, 429 and
// 500–599 are [KindTransient], any other 400–499 is [KindRejected], and
// everything else (including 2xx and 3xx) is [KindUnknown]. A status alone
// never says [KindRefused]: a provider's content filter answers 400 with
// a code in its body (OpenAI's "content_policy_violation", Azure's
// "content_filter"), which an adapter reads and reports with [Refusal].
func ClassifyStatus(code int) Kind {
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return KindTransient
	case code >= 500 && code <= 599:
		return KindTransient
	case code >= 400 && code <= 499:
		return KindRejected
	}
	return KindUnknown
}

// Classify returns the Kind of err. It is the default for
// [Chain.Classify]. The outermost of this package's typed errors in err's
// tree decides, found as errors.As finds it: [*Cancelled] is
// [KindCancelled], [*Truncated] is [KindTruncated], [*TimedOut] is
// [KindTimeout], [*Exhausted] is the Kind of its last attempt, and
// [*Failure] is its own Kind, whatever it wraps. Only when there is none
// do the other rules apply: context.Canceled is [KindCancelled];
// context.DeadlineExceeded (which [ErrAttemptTimeout] and [ErrStalled]
// match) or a net.Error whose Timeout() is true anywhere in the tree is
// [KindTimeout]; ECONNREFUSED, ECONNRESET, ECONNABORTED, EPIPE,
// io.ErrUnexpectedEOF, io.EOF (how net/http reports a connection closed
// before any response) and a failed dial are [KindTransient]. Anything
// else, nil included, is [KindUnknown].
//
// So an error that [Chain.Do] returned is classified by its outcome
// alone, since no attempt's error and no cause is in its tree: a
// [*TimedOut] whose last attempt's client returned context.Canceled is
// [KindTimeout], a [*Cancelled] whose cause is a sibling's 400 is
// [KindCancelled]. A backend that returns an inner chain's error wrapped in
// one of its own is classified by that inner outcome, which errors.As
// finds beneath the backend's wrapping.
func Classify(err error) Kind {
	if err == nil {
		return KindUnknown
	}
	kind, _ := outcomeOf(err)
	return kind
}

// typedError is implemented by the package's own error types. The
// outermost one in an error's tree speaks for everything beneath it: a
// backend that wraps an inner chain's error in a Failure of its own has
// said what it means.
type typedError interface {
	error
	outcome() (Kind, detail)
}

// detail is what an attempt's record keeps of its error beyond the Kind.
type detail struct {
	status int
	raw    *string
	hint   time.Duration
	limits *limitReport // the failure's rate-limit report, its send not yet set; nil when none
	usage  *Usage       // what the failed attempt cost, nil when unknown
}

// outcomeOf returns err's Kind and the details its record keeps, both from
// the same node: the outermost typed error, or else the other rules of
// Classify, which leave no details.
func outcomeOf(err error) (Kind, detail) {
	// Most backends return one of our errors as it is. errors.As, which
	// allocates its target, is for the ones wrapped in others (a retried
	// call costs 23% less this way: bench/results, benchstat p=0.009).
	if t, ok := err.(typedError); ok {
		return t.outcome()
	}
	var t typedError
	if errors.As(err, &t) {
		return t.outcome()
	}
	return classifyOther(err), detail{}
}

// classifyOther applies the rules for errors that are not the package's
// own.
func classifyOther(err error) Kind {
	switch {
	case errors.Is(err, context.Canceled):
		return KindCancelled
	case errors.Is(err, context.DeadlineExceeded), netTimeout(err):
		return KindTimeout
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE:
			return KindTransient
		}
	}
	// io.EOF is what net/http returns when the server closed the connection
	// before sending any response: nothing was processed, so it is safe to
	// send again.
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return KindTransient
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return KindTransient
	}
	return KindUnknown // conservatively: an unknown error fails over rather than hammering
}

// netTimeout reports whether any net.Error in err's tree says Timeout.
// errors.As would stop at the first net.Error, and a *url.Error over a
// %w-wrapped timeout answers false for the timeout beneath it.
func netTimeout(err error) bool {
	for err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return true
		}
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if netTimeout(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// ParseRetryAfter reads a server's hint of how long to wait from h:
// "retry-after-ms" (milliseconds, as OpenAI-compatible APIs send it), then
// "retry-after" as seconds or as an HTTP date, measured from now. A date in
// the past gives 0. A well-formed hint too long for a Duration saturates
// at the longest Duration, so it counts as longer than any MaxWait. It
// returns false when h holds no hint it can read; negative or malformed
// values are ignored.
func ParseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	if d, ok := parseAmount(headerValue(h, "Retry-After-Ms"), time.Millisecond); ok {
		return d, true
	}
	v := strings.TrimSpace(headerValue(h, "Retry-After"))
	if v == "" {
		return 0, false
	}
	if d, ok := parseAmount(v, time.Second); ok {
		return d, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true // Sub saturates for dates far off
	}
	return 0, false
}

// parseAmount reads a non-negative decimal number of units, such as "120"
// or "1.5", saturating at the longest Duration. Anything else (a sign, an
// exponent, NaN, other characters) is not a hint.
func parseAmount(v string, unit time.Duration) (time.Duration, bool) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(v), ".")
	if !allDigits(whole) || (frac != "" && !allDigits(frac)) {
		return 0, false
	}
	n, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || n > uint64(math.MaxInt64/unit) {
		return math.MaxInt64, true // only a range error is left: saturate
	}
	d := time.Duration(n) * unit
	if frac != "" {
		f, _ := strconv.ParseFloat("0."+frac, 64) // digits only: it parses
		d += min(time.Duration(f*float64(unit)), math.MaxInt64-d)
	}
	return d, true
}

// allDigits reports whether s is one or more ASCII digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Failure is what a backend returns to say how it failed and what the
// model produced, so the chain can decide without guessing from text.
// Backends build one with [StatusFailure], [Truncation], [ParseFailure]
// or [Refusal], or as a literal. Wrapping a Failure with %w keeps it
// visible to the chain.
type Failure struct {
	Kind       Kind          // how it failed; decides retry and fail-over
	Status     int           // HTTP status, 0 if none
	RetryAfter time.Duration // the server's hint, 0 if none
	RawText    *string       // the model's output; nil when there is none worth keeping
	Err        error         // the cause, may be nil
	Usage      *Usage        // what the provider reported the attempt cost (a truncated or unparsable answer is billed); nil when unknown

	// limits is what StatusFailure read of the response's rate-limit
	// headers, its send not yet known; nil when they said nothing. Do
	// hands it to the backend's Breaker, as ReportLimits would.
	limits *limitReport
}

// Error describes the failure as "http 503: cause" when it has a status,
// else as "kind: cause"; the cause is left out when Err is nil. It carries
// no "llmretry: " prefix because it is the backend's own report, printed
// inside the chain's attempt lines. Secrets are redacted ([Redact]).
func (f *Failure) Error() string {
	if f == nil {
		return "llmretry: nil *Failure"
	}
	var b strings.Builder
	if f.Status != 0 {
		b.WriteString("http ")
		b.WriteString(strconv.Itoa(f.Status))
	} else {
		b.WriteString(f.Kind.String())
	}
	if f.Err != nil {
		b.WriteString(": ")
		b.WriteString(f.Err.Error())
	}
	return Redact(b.String())
}

// Unwrap returns the cause, so errors.Is and errors.As see through a
// Failure.
func (f *Failure) Unwrap() error {
	if f == nil {
		return nil
	}
	return f.Err
}

// outcome is the Failure's own Kind and details, whatever it wraps: the
// backend that built it has said what it means.
func (f *Failure) outcome() (Kind, detail) {
	if f == nil {
		return KindUnknown, detail{}
	}
	return f.Kind, detail{f.Status, f.RawText, f.RetryAfter, f.limits, f.Usage}
}

// StatusFailure describes an HTTP error response. Its Kind comes from
// [ClassifyStatus], overridden by an "x-should-retry" header: "true"
// makes it [KindTransient], "false" [KindRejected] (any letter case;
// other values are ignored). Its RetryAfter comes from [ParseRetryAfter]
// on h. It reads h's rate-limit headers too, as [ReportLimits] does, and
// the chain hands them to the backend's [Breaker]: a Call that returns it
// need not report that response itself. h may be nil.
func StatusFailure(code int, h http.Header, err error) *Failure {
	f := &Failure{Kind: ClassifyStatus(code), Status: code, Err: err}
	if h == nil {
		return f
	}
	// Providers that send x-should-retry know better than the status code
	// (a 409 lock conflict that will clear, a 500 that never will).
	switch strings.ToLower(strings.TrimSpace(h.Get("X-Should-Retry"))) {
	case "true":
		f.Kind = KindTransient
	case "false":
		f.Kind = KindRejected
	}
	now := time.Now()
	if d, ok := ParseRetryAfter(h, now); ok {
		f.RetryAfter = d
	}
	if r, ok := parseLimits(h, time.Time{}, now); ok {
		f.limits = &r
	}
	return f
}

// Truncation describes a completion that stopped at its token budget
// (finish_reason "length"), keeping the partial output raw.
func Truncation(raw string) *Failure {
	return &Failure{Kind: KindTruncated, RawText: &raw}
}

// Refusal describes an answer the provider refused for its content: a
// content filter, a safety block, a refusal stop reason. reason is the
// provider's own word for it, such as "finish_reason content_filter" or
// "finishReason SAFETY"; it becomes Err, so the summary and the records
// say why. Set RawText on the result to keep what the model had written.
func Refusal(reason string) *Failure {
	return &Failure{Kind: KindRefused, Err: errors.New(reason)}
}

// ParseFailure describes model output that could not be used, keeping
// the output raw so the caller can show what the model said.
func ParseFailure(raw string, err error) *Failure {
	return &Failure{Kind: KindParse, RawText: &raw, Err: err}
}
