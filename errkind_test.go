package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
)

func TestKind(t *testing.T) {
	tests := []struct {
		kind          llmretry.Kind
		wantString    string
		wantRetryable bool
	}{
		{llmretry.KindUnknown, "unknown", false},
		{llmretry.KindTransient, "transient", true},
		{llmretry.KindTimeout, "timeout", true},
		{llmretry.KindTruncated, "truncated", false},
		{llmretry.KindParse, "parse", true},
		{llmretry.KindRejected, "rejected", false},
		{llmretry.KindCancelled, "cancelled", false},
	}
	for _, tc := range tests {
		t.Run(tc.wantString, func(t *testing.T) {
			text, err := tc.kind.MarshalText()
			if err != nil || string(text) != tc.wantString {
				t.Errorf("MarshalText() = %q, %v, want %q, nil", text, err, tc.wantString)
			}
			var back llmretry.Kind
			if err := back.UnmarshalText(text); err != nil || back != tc.kind {
				t.Errorf("UnmarshalText(%q) = %v, %v, want %v, nil", text, back, err, tc.kind)
			}
			if got := tc.kind.String(); got != tc.wantString {
				t.Errorf("Kind(%d).String() = %q, want %q", tc.kind, got, tc.wantString)
			}
			if got := tc.kind.Retryable(); got != tc.wantRetryable {
				t.Errorf("%v.Retryable() = %t, want %t", tc.kind, got, tc.wantRetryable)
			}
		})
	}
}

func TestKindOutOfRange(t *testing.T) {
	k := llmretry.Kind(9)
	if got := k.String(); got != "kind(9)" {
		t.Errorf("Kind(9).String() = %q, want %q", got, "kind(9)")
	}
	if k.Retryable() {
		t.Errorf("Kind(9).Retryable() = true, want false")
	}
	// A custom Classify may return such a Kind: its records must still
	// encode, and decode to the same value.
	text, err := k.MarshalText()
	if err != nil || string(text) != "kind(9)" {
		t.Fatalf("Kind(9).MarshalText() = %q, %v, want %q, nil", text, err, "kind(9)")
	}
	var back llmretry.Kind
	if err := back.UnmarshalText(text); err != nil || back != k {
		t.Errorf("UnmarshalText(%q) = %v, %v, want %v, nil", text, back, err, k)
	}
	for _, bad := range []string{"kind(256)", "kind(-1)", "kind(x)", "kind(3", "Transient"} {
		if err := back.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("UnmarshalText(%q) error = nil, want an error", bad)
		}
	}
}

// timeoutErr is a net.Error that reports a timeout.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func attemptsOf(kinds ...llmretry.Kind) []llmretry.Attempt {
	var as []llmretry.Attempt
	for i, k := range kinds {
		as = append(as, llmretry.Attempt{Backend: i, Model: fmt.Sprintf("m%d", i), Try: 1, Kind: k, Err: fmt.Errorf("attempt %d failed", i)})
	}
	return as
}

func TestClassify(t *testing.T) {
	exhausted := &llmretry.Exhausted{Attempts: attemptsOf(llmretry.KindTimeout, llmretry.KindRejected)}
	tests := []struct {
		name string
		err  error
		want llmretry.Kind
	}{
		{"cancelled", &llmretry.Cancelled{Cause: errors.New("bye")}, llmretry.KindCancelled},
		{"truncated", &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attemptsOf(llmretry.KindTimeout)}}, llmretry.KindTruncated},
		{"timed_out", &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attemptsOf(llmretry.KindTransient)}}, llmretry.KindTimeout},
		{"exhausted_takes_last_kind", exhausted, llmretry.KindRejected},
		{"wrapped_exhausted", fmt.Errorf("layer: %w", exhausted), llmretry.KindRejected},
		{"failure", llmretry.ParseFailure("{", errors.New("eof")), llmretry.KindParse},
		{"failure_before_its_cause", &llmretry.Failure{Kind: llmretry.KindParse, Err: context.Canceled}, llmretry.KindParse},
		{"wrapped_failure", fmt.Errorf("openai: %w", llmretry.StatusFailure(400, nil, nil)), llmretry.KindRejected},
		{"context_canceled", context.Canceled, llmretry.KindCancelled},
		{"url_error_canceled", &url.Error{Op: "Post", URL: "https://api.example", Err: context.Canceled}, llmretry.KindCancelled},
		{"deadline_exceeded", context.DeadlineExceeded, llmretry.KindTimeout},
		{"net_timeout", &url.Error{Op: "Post", URL: "https://api.example", Err: timeoutErr{}}, llmretry.KindTimeout},
		{"dial_timeout", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, llmretry.KindTimeout},
		// A *url.Error over a %w-wrapped timeout answers Timeout() false
		// itself; the timeout beneath it is still a net.Error whose
		// Timeout() is true.
		{"net_timeout_under_wrapping_url_error", &url.Error{Op: "Post", URL: "https://api.example", Err: fmt.Errorf("read body: %w", timeoutErr{})}, llmretry.KindTimeout},
		{"econnrefused", syscall.ECONNREFUSED, llmretry.KindTransient},
		{"econnreset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, llmretry.KindTransient},
		{"econnaborted", syscall.ECONNABORTED, llmretry.KindTransient},
		{"epipe", fmt.Errorf("write: %w", syscall.EPIPE), llmretry.KindTransient},
		{"unexpected_eof", io.ErrUnexpectedEOF, llmretry.KindTransient},
		{"eof", &url.Error{Op: "Post", URL: "https://api.example", Err: io.EOF}, llmretry.KindTransient},
		{"dial_op_error", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route to host")}, llmretry.KindTransient},
		{"other", errors.New("something else"), llmretry.KindUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := llmretry.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestClassifyStatus(t *testing.T) {
	tests := []struct {
		code int
		want llmretry.Kind
	}{
		{0, llmretry.KindUnknown},
		{200, llmretry.KindUnknown},
		{399, llmretry.KindUnknown},
		{400, llmretry.KindRejected},
		{401, llmretry.KindRejected},
		{404, llmretry.KindRejected},
		{408, llmretry.KindTransient},
		{413, llmretry.KindRejected},
		{425, llmretry.KindTransient},
		{429, llmretry.KindTransient},
		{499, llmretry.KindRejected},
		{500, llmretry.KindTransient},
		{503, llmretry.KindTransient},
		{529, llmretry.KindTransient},
		{599, llmretry.KindTransient},
		{600, llmretry.KindUnknown},
	}
	for _, tc := range tests {
		if got := llmretry.ClassifyStatus(tc.code); got != tc.want {
			t.Errorf("ClassifyStatus(%d) = %v, want %v", tc.code, got, tc.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		wantOK bool
	}{
		{name: "none"},
		{name: "milliseconds", header: map[string]string{"Retry-After-Ms": "250"}, want: 250 * time.Millisecond, wantOK: true},
		{name: "seconds", header: map[string]string{"Retry-After": "2"}, want: 2 * time.Second, wantOK: true},
		{name: "http_date", header: map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, want: 90 * time.Second, wantOK: true},
		{name: "milliseconds_first", header: map[string]string{"Retry-After-Ms": "1500", "Retry-After": "30"}, want: 1500 * time.Millisecond, wantOK: true},
		{name: "garbage", header: map[string]string{"Retry-After": "soon"}},
		{name: "negative_seconds", header: map[string]string{"Retry-After": "-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			got, ok := llmretry.ParseRetryAfter(h, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("ParseRetryAfter(%v) = %v, %t, want %v, %t", tc.header, got, ok, tc.want, tc.wantOK)
			}
		})
	}
	if got, ok := llmretry.ParseRetryAfter(nil, now); got != 0 || ok {
		t.Errorf("ParseRetryAfter(nil) = %v, %t, want 0, false", got, ok)
	}
}

func TestStatusFailure(t *testing.T) {
	cause := errors.New("upstream on fire")
	tests := []struct {
		name   string
		code   int
		header map[string]string
		err    error
		want   *llmretry.Failure
	}{
		{name: "503", code: 503, err: cause, want: &llmretry.Failure{Kind: llmretry.KindTransient, Status: 503, Err: cause}},
		{name: "400_no_cause", code: 400, want: &llmretry.Failure{Kind: llmretry.KindRejected, Status: 400}},
		{name: "429_retry_after", code: 429, header: map[string]string{"Retry-After": "2"}, want: &llmretry.Failure{Kind: llmretry.KindTransient, Status: 429, RetryAfter: 2 * time.Second}},
		{name: "429_retry_after_ms", code: 429, header: map[string]string{"Retry-After-Ms": "750"}, want: &llmretry.Failure{Kind: llmretry.KindTransient, Status: 429, RetryAfter: 750 * time.Millisecond}},
		{name: "retry_after_date", code: 503, header: map[string]string{"Retry-After": "date+5s"}, want: &llmretry.Failure{Kind: llmretry.KindTransient, Status: 503, RetryAfter: 5 * time.Second}},
		{name: "should_retry_true_on_400", code: 400, header: map[string]string{"X-Should-Retry": "true"}, want: &llmretry.Failure{Kind: llmretry.KindTransient, Status: 400}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// In a bubble time.Now is fixed, so an HTTP date gives an exact wait.
			synctest.Test(t, func(t *testing.T) {
				h := http.Header{}
				for k, v := range tc.header {
					if v == "date+5s" {
						v = time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat)
					}
					h.Set(k, v)
				}
				got := llmretry.StatusFailure(tc.code, h, tc.err)
				if got == nil {
					t.Fatalf("StatusFailure(%d, %v, %v) = nil", tc.code, tc.header, tc.err)
				}
				// Compare the structs: a *Failure is itself an error, which
				// EquateErrors would match by identity.
				if diff := cmp.Diff(*tc.want, *got, cmpopts.EquateErrors(), cmpopts.IgnoreUnexported(llmretry.Failure{})); diff != "" {
					t.Errorf("StatusFailure(%d, %v, %v) mismatch (-want +got):\n%s", tc.code, tc.header, tc.err, diff)
				}
			})
		})
	}

	t.Run("should_retry_false_on_503", func(t *testing.T) {
		h := http.Header{}
		h.Set("X-Should-Retry", "false")
		got := llmretry.StatusFailure(503, h, nil)
		if got.Kind.Retryable() || got.Kind == llmretry.KindCancelled || got.Status != 503 {
			t.Errorf("StatusFailure(503, x-should-retry: false) = Kind %v, Status %d, want a Kind that fails over, Status 503", got.Kind, got.Status)
		}
	})
}

func TestFailure(t *testing.T) {
	cause := errors.New("unexpected ]")
	tests := []struct {
		name        string
		f           *llmretry.Failure
		wantErr     string
		wantKind    llmretry.Kind
		wantRawText *string
		wantUnwrap  error
	}{
		{name: "status_with_cause", f: llmretry.StatusFailure(500, nil, errors.New("upstream on fire")), wantErr: "http 500: upstream on fire", wantKind: llmretry.KindTransient},
		{name: "status_only", f: llmretry.StatusFailure(503, nil, nil), wantErr: "http 503", wantKind: llmretry.KindTransient},
		{name: "parse", f: llmretry.ParseFailure("[1, 2]]", cause), wantErr: "parse: unexpected ]", wantKind: llmretry.KindParse, wantRawText: ptr("[1, 2]]"), wantUnwrap: cause},
		{name: "truncation", f: llmretry.Truncation("The answer is"), wantErr: "truncated", wantKind: llmretry.KindTruncated, wantRawText: ptr("The answer is")},
		{name: "truncation_empty", f: llmretry.Truncation(""), wantErr: "truncated", wantKind: llmretry.KindTruncated, wantRawText: ptr("")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Error(); got != tc.wantErr {
				t.Errorf("Error() = %q, want %q", got, tc.wantErr)
			}
			if tc.f.Kind != tc.wantKind {
				t.Errorf("Kind = %v, want %v", tc.f.Kind, tc.wantKind)
			}
			if diff := cmp.Diff(tc.wantRawText, tc.f.RawText); diff != "" {
				t.Errorf("RawText (-want +got):\n%s", diff)
			}
			if (tc.wantRawText == nil) != (tc.f.RawText == nil) {
				t.Errorf("RawText = %v, want nil: %t", tc.f.RawText, tc.wantRawText == nil)
			}
			if tc.wantUnwrap != nil && tc.f.Unwrap() != tc.wantUnwrap {
				t.Errorf("Unwrap() = %v, want %v", tc.f.Unwrap(), tc.wantUnwrap)
			}
		})
	}
}

func TestExhaustPrecedence(t *testing.T) {
	tests := []struct {
		name     string
		kinds    []llmretry.Kind
		wantType string
	}{
		{"transient_and_rejected", []llmretry.Kind{llmretry.KindTransient, llmretry.KindRejected}, "*llmretry.Exhausted"},
		{"parse_and_unknown", []llmretry.Kind{llmretry.KindParse, llmretry.KindUnknown}, "*llmretry.Exhausted"},
		{"timeout", []llmretry.Kind{llmretry.KindTransient, llmretry.KindTimeout, llmretry.KindRejected}, "*llmretry.TimedOut"},
		{"truncated", []llmretry.Kind{llmretry.KindRejected, llmretry.KindTruncated}, "*llmretry.Truncated"},
		{"truncated_beats_timeout", []llmretry.Kind{llmretry.KindTimeout, llmretry.KindTruncated, llmretry.KindTimeout}, "*llmretry.Truncated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			attempts := attemptsOf(tc.kinds...)
			err := llmretry.Exhaust(attempts)
			if got := fmt.Sprintf("%T", err); got != tc.wantType {
				t.Fatalf("Exhaust() = %s, want %s", got, tc.wantType)
			}
			var ex *llmretry.Exhausted
			if !errors.As(err, &ex) {
				t.Fatalf("errors.As(%T, *Exhausted) = false, want true", err)
			}
			if diff := cmp.Diff(attempts, ex.Attempts, cmpopts.EquateErrors(), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
				t.Errorf("Attempts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestErrorsAsMatrix is contract test 9 (the JSON half is in attempt_test.go).
func TestErrorsAsMatrix(t *testing.T) {
	attempts := attemptsOf(llmretry.KindTransient, llmretry.KindTimeout)
	truncated := &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}
	timedOut := &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}}
	plain := &llmretry.Exhausted{Attempts: attempts}
	cause := errors.New("user left")
	cancelled := &llmretry.Cancelled{Attempts: attempts, Cause: cause}

	tests := []struct {
		name          string
		err           error
		wantExhausted *llmretry.Exhausted // what an *Exhausted handler catches; nil: not caught
		wantTimedOut  bool
		wantTruncated bool
		wantCancelled bool
		wantDeadline  bool // errors.Is(err, context.DeadlineExceeded)
		wantCanceled  bool // errors.Is(err, context.Canceled)
		wantRetryItem bool
	}{
		{name: "exhausted", err: plain, wantExhausted: plain, wantRetryItem: true},
		{name: "truncated", err: truncated, wantExhausted: &truncated.Exhausted, wantTruncated: true},
		{name: "timed_out", err: timedOut, wantExhausted: &timedOut.Exhausted, wantTimedOut: true, wantDeadline: true, wantRetryItem: true},
		{name: "cancelled", err: cancelled, wantCancelled: true, wantCanceled: true, wantRetryItem: true},
		{name: "wrapped_truncated", err: fmt.Errorf("summarise: %w", truncated), wantExhausted: &truncated.Exhausted, wantTruncated: true},
		{name: "wrapped_timed_out", err: fmt.Errorf("summarise: %w", timedOut), wantExhausted: &timedOut.Exhausted, wantTimedOut: true, wantDeadline: true, wantRetryItem: true},
		{name: "wrapped_cancelled", err: fmt.Errorf("summarise: %w", cancelled), wantCancelled: true, wantCanceled: true, wantRetryItem: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ex *llmretry.Exhausted
			if got := errors.As(tc.err, &ex); got != (tc.wantExhausted != nil) {
				t.Errorf("errors.As(err, *Exhausted) = %t, want %t", got, tc.wantExhausted != nil)
			} else if got && ex != tc.wantExhausted {
				t.Errorf("errors.As(err, *Exhausted) caught %p, want the embedded Exhausted %p", ex, tc.wantExhausted)
			}
			if ex != nil {
				if diff := cmp.Diff(attempts, ex.Attempts, cmpopts.EquateErrors(), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
					t.Errorf("caught Attempts (-want +got):\n%s", diff)
				}
			}
			var to *llmretry.TimedOut
			if got := errors.As(tc.err, &to); got != tc.wantTimedOut {
				t.Errorf("errors.As(err, *TimedOut) = %t, want %t", got, tc.wantTimedOut)
			}
			var tr *llmretry.Truncated
			if got := errors.As(tc.err, &tr); got != tc.wantTruncated {
				t.Errorf("errors.As(err, *Truncated) = %t, want %t", got, tc.wantTruncated)
			}
			var ca *llmretry.Cancelled
			if got := errors.As(tc.err, &ca); got != tc.wantCancelled {
				t.Errorf("errors.As(err, *Cancelled) = %t, want %t", got, tc.wantCancelled)
			}
			if got := errors.Is(tc.err, context.DeadlineExceeded); got != tc.wantDeadline {
				t.Errorf("errors.Is(err, context.DeadlineExceeded) = %t, want %t", got, tc.wantDeadline)
			}
			if got := errors.Is(tc.err, context.Canceled); got != tc.wantCanceled {
				t.Errorf("errors.Is(err, context.Canceled) = %t, want %t", got, tc.wantCanceled)
			}
			if got := llmretry.RetryItem(tc.err); got != tc.wantRetryItem {
				t.Errorf("RetryItem(err) = %t, want %t", got, tc.wantRetryItem)
			}
			// No attempt's error is in the tree: the records keep them.
			for i, a := range attempts {
				if a.Err != nil && errors.Is(tc.err, a.Err) {
					t.Errorf("errors.Is(err, attempt %d's Err) = true, want false", i)
				}
			}
		})
	}
	if llmretry.RetryItem(nil) {
		t.Errorf("RetryItem(nil) = true, want false")
	}
	if errors.Is(cancelled, cause) {
		t.Errorf("errors.Is(*Cancelled, its Cause) = true, want false: the Cause is a field")
	}
}

// TestErrorUnwrap checks what each error's tree holds: Truncated and
// TimedOut their Exhausted, and nothing else below any of them.
func TestErrorUnwrap(t *testing.T) {
	attempts := attemptsOf(llmretry.KindTransient, llmretry.KindRejected)
	attempts = append(attempts, llmretry.Attempt{Backend: 2, Model: "m2", Try: 1, Kind: llmretry.KindUnknown}) // Err nil

	t.Run("exhausted", func(t *testing.T) {
		var ex any = &llmretry.Exhausted{Attempts: attempts}
		if _, ok := ex.(interface{ Unwrap() []error }); ok {
			t.Errorf("*Exhausted has Unwrap() []error, want no Unwrap: the attempts are records, not its tree")
		}
		if _, ok := ex.(interface{ Unwrap() error }); ok {
			t.Errorf("*Exhausted has Unwrap() error, want no Unwrap")
		}
	})
	t.Run("truncated", func(t *testing.T) {
		tr := &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}
		if got := tr.Unwrap(); got != error(&tr.Exhausted) {
			t.Errorf("Truncated.Unwrap() = %p, want &tr.Exhausted %p", got, &tr.Exhausted)
		}
	})
	t.Run("timed_out", func(t *testing.T) {
		to := &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}, Cause: errors.New("budget")}
		if got := to.Unwrap(); got != error(&to.Exhausted) {
			t.Errorf("TimedOut.Unwrap() = %p, want &to.Exhausted %p", got, &to.Exhausted)
		}
		var te interface{ Timeout() bool }
		if !errors.As(to, &te) || !te.Timeout() {
			t.Errorf("*TimedOut Timeout() is not true")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		var c any = &llmretry.Cancelled{Attempts: attempts, Cause: errors.New("user left")}
		_, one := c.(interface{ Unwrap() error })
		_, many := c.(interface{ Unwrap() []error })
		if one || many {
			t.Errorf("*Cancelled has an Unwrap method, want none: its Cause is a field")
		}
	})
	t.Run("cancelled_nil_cause", func(t *testing.T) {
		c := &llmretry.Cancelled{}
		if !errors.Is(c, context.Canceled) {
			t.Errorf("errors.Is(Cancelled{}, context.Canceled) = false, want true")
		}
	})
}

func TestErrorSummaries(t *testing.T) {
	const (
		budget   = "raise the completion budget (max tokens)"
		deadline = "raise the deadline"
		timeout  = "raise the backends' Timeout or StallTimeout"
	)
	attempts := []llmretry.Attempt{
		{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 500, Err: llmretry.StatusFailure(500, nil, errors.New("upstream on fire"))},
		{Backend: 0, Model: "gpt-4o", Try: 2, Kind: llmretry.KindParse, Err: llmretry.ParseFailure("{", errors.New("unexpected end of JSON input"))},
		{Backend: 1, Model: "claude", Try: 1, Kind: llmretry.KindRejected, Status: 400, Err: llmretry.StatusFailure(400, nil, errors.New("bad request"))},
	}
	with := func(k llmretry.Kind) []llmretry.Attempt {
		as := append([]llmretry.Attempt(nil), attempts...)
		as[1].Kind = k
		return as
	}
	both := with(llmretry.KindTruncated)
	both[0].Kind = llmretry.KindTimeout
	// The caller's deadline ended the chain: the last record says so.
	late := with(llmretry.KindTimeout)
	late[2].Next, late[2].Why = llmretry.NextStop, llmretry.WhyDeadline

	tests := []struct {
		name         string
		err          error
		attempts     []llmretry.Attempt
		wantBudget   bool
		wantDeadline bool
		wantTimeout  bool
	}{
		{name: "exhausted", err: &llmretry.Exhausted{Attempts: attempts}, attempts: attempts},
		{name: "exhaust_plain", err: llmretry.Exhaust(attempts), attempts: attempts},
		{name: "exhaust_truncated", err: llmretry.Exhaust(with(llmretry.KindTruncated)), attempts: with(llmretry.KindTruncated), wantBudget: true},
		{name: "exhaust_timed_out", err: llmretry.Exhaust(with(llmretry.KindTimeout)), attempts: with(llmretry.KindTimeout), wantTimeout: true},
		{name: "exhaust_both", err: llmretry.Exhaust(both), attempts: both, wantBudget: true, wantTimeout: true},
		{name: "deadline_passed", err: llmretry.Exhaust(late), attempts: late, wantDeadline: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lines := strings.Split(tc.err.Error(), "\n")
			head := lines[0]
			if !strings.HasPrefix(head, "llmretry: ") {
				t.Errorf("first line = %q, want prefix %q", head, "llmretry: ")
			}
			if !strings.Contains(head, "3 attempts") || !strings.Contains(head, "2 backends") {
				t.Errorf("first line = %q, want it to count 3 attempts and 2 backends", head)
			}
			if got := strings.Contains(head, budget); got != tc.wantBudget {
				t.Errorf("first line = %q, names %q: %t, want %t", head, budget, got, tc.wantBudget)
			}
			if got := strings.Contains(head, deadline); got != tc.wantDeadline {
				t.Errorf("first line = %q, names %q: %t, want %t", head, deadline, got, tc.wantDeadline)
			}
			if got := strings.Contains(head, timeout); got != tc.wantTimeout {
				t.Errorf("first line = %q, names %q: %t, want %t", head, timeout, got, tc.wantTimeout)
			}
			var want []string
			for _, a := range tc.attempts {
				want = append(want, a.String())
			}
			var got []string
			for _, l := range lines[1:] {
				got = append(got, strings.TrimSpace(l))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("attempt lines (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		c := &llmretry.Cancelled{Attempts: attempts[:1], Cause: errors.New("user left")}
		got := c.Error()
		if !strings.HasPrefix(got, "llmretry: ") || !strings.Contains(got, "user left") || strings.Contains(got, "\n") {
			t.Errorf("Cancelled.Error() = %q, want one line starting %q naming the cause", got, "llmretry: ")
		}
	})
}

// The first line counts the requests sent and the skips for a breaker
// apart: a skip put no load on the provider.
func TestErrorSummaryCountsSkipsApart(t *testing.T) {
	sent := func(b, try int) llmretry.Attempt {
		return llmretry.Attempt{Backend: b, Model: "m" + strconv.Itoa(b), Try: try, Kind: llmretry.KindTransient, Err: errors.New("busy"), Next: llmretry.NextRetry}
	}
	skip := func(b, try int) llmretry.Attempt {
		return llmretry.Attempt{Backend: b, Model: "m" + strconv.Itoa(b), Try: try, Kind: llmretry.KindTransient, Next: llmretry.NextFailOver, Why: llmretry.WhyBreaker, Skipped: true}
	}
	tests := []struct {
		name string
		err  error
		want string // the first line up to the lever
	}{
		{"none", &llmretry.Exhausted{}, "llmretry: exhausted before any attempt: "},
		{"sent_only", &llmretry.Exhausted{Attempts: []llmretry.Attempt{sent(0, 1), sent(0, 2), sent(1, 1)}}, "llmretry: exhausted after 3 attempts on 2 backends: "},
		{"sent_and_skip", &llmretry.Exhausted{Attempts: []llmretry.Attempt{skip(0, 1), sent(1, 1), sent(1, 2), sent(1, 3)}}, "llmretry: exhausted after 3 attempts and 1 skip on 2 backends: "},
		{"skips_only", &llmretry.Exhausted{Attempts: []llmretry.Attempt{skip(0, 1), skip(1, 1)}}, "llmretry: exhausted after 0 attempts and 2 skips on 2 backends: "},
		{"one_each", &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: []llmretry.Attempt{skip(0, 1), sent(1, 1)}}}, "llmretry: timed out after 1 attempt and 1 skip on 2 backends: "},
		{"cancelled", &llmretry.Cancelled{Attempts: []llmretry.Attempt{skip(0, 1), sent(1, 1), sent(1, 2)}, Cause: errors.New("user left")}, "llmretry: cancelled after 2 attempts and 1 skip: user left"},
		{"cancelled_none", &llmretry.Cancelled{}, "llmretry: cancelled after 0 attempts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); !strings.HasPrefix(got, tc.want) {
				t.Errorf("Error() = %q, want it to begin %q", got, tc.want)
			}
		})
	}
}

// The outermost of our typed errors in the tree decides the Kind, and the
// record's details come from that same node.
func TestClassifyOutermostTypedErrorDecides(t *testing.T) {
	innerRejected := &llmretry.Exhausted{Attempts: []llmretry.Attempt{{Kind: llmretry.KindRejected, Status: 400, RawText: ptr("inner"), Err: errors.New("bad")}}}
	innerTruncated := &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: []llmretry.Attempt{{Kind: llmretry.KindTruncated}}}}
	tests := []struct {
		name string
		err  error
		want llmretry.Kind
	}{
		{"failure_over_exhausted", &llmretry.Failure{Kind: llmretry.KindTransient, Err: innerRejected}, llmretry.KindTransient},
		{"failure_over_truncated", &llmretry.Failure{Kind: llmretry.KindTransient, Err: innerTruncated}, llmretry.KindTransient},
		{"failure_over_cancelled", &llmretry.Failure{Kind: llmretry.KindRejected, Err: &llmretry.Cancelled{}}, llmretry.KindRejected},
		{"wrapped_failure_over_timed_out", fmt.Errorf("sdk: %w", &llmretry.Failure{Kind: llmretry.KindParse, Err: &llmretry.TimedOut{}}), llmretry.KindParse},
		{"joined_failure_first", errors.Join(&llmretry.Failure{Kind: llmretry.KindRejected}, innerTruncated), llmretry.KindRejected},
		{"failure_over_context_rules", &llmretry.Failure{Kind: llmretry.KindUnknown, Err: context.DeadlineExceeded}, llmretry.KindUnknown},
		{"exhausted_over_failure", &llmretry.Exhausted{Attempts: []llmretry.Attempt{{Kind: llmretry.KindTimeout, Err: busy("x")}}}, llmretry.KindTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := llmretry.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestDoRecordDetailsFromTheDecidingNode(t *testing.T) {
	synctest.Test(t, testDoRecordDetailsFromTheDecidingNode)
}

func testDoRecordDetailsFromTheDecidingNode(t *testing.T) {
	inner := &llmretry.Exhausted{Attempts: []llmretry.Attempt{{Kind: llmretry.KindRejected, Status: 400, RawText: ptr("inner"), Err: errors.New("bad")}}}
	outer := &llmretry.Failure{Kind: llmretry.KindTransient, Status: 502, RetryAfter: 20 * ms, Err: inner}
	a := newFake("a", script(outer))
	c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10 * ms)}}}
	rec := newRecorder()
	c.OnAttempt = rec.OnAttempt

	if got, err := c.Do(context.Background(), "hi"); got != "a: hi" || err != nil {
		t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
	}
	seen, _ := rec.seen()
	want := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 502, Err: outer, RetryAfter: 20 * ms, Next: llmretry.NextRetry, RetryIn: 20 * ms}
	if diff := cmp.Diff(want, seen[0], attemptOpts, ignoreTimes); diff != "" {
		t.Errorf("first attempt (-want +got):\n%s", diff)
	}
}

// An outer attempt whose error is an inner chain's takes its details from
// the inner attempt that gave the outer Kind.
func TestDoNestedTruncatedKeepsPartialOutput(t *testing.T) {
	tests := []struct {
		name       string
		inner      []error // the inner chain's backends fail with these
		wantKind   llmretry.Kind
		wantStatus int
		wantRaw    *string
	}{
		{
			name:     "truncated_then_busy",
			inner:    []error{llmretry.Truncation("partial answer"), busy("busy")},
			wantKind: llmretry.KindTruncated, wantRaw: ptr("partial answer"),
		},
		{
			name:     "timeout_then_rejected",
			inner:    []error{&llmretry.Failure{Kind: llmretry.KindTimeout, Status: 504, RawText: ptr("gateway")}, llmretry.StatusFailure(400, nil, errors.New("bad"))},
			wantKind: llmretry.KindTimeout, wantStatus: 504, wantRaw: ptr("gateway"),
		},
		{
			name:     "busy_then_rejected",
			inner:    []error{busy("busy"), llmretry.StatusFailure(400, nil, errors.New("bad"))},
			wantKind: llmretry.KindRejected, wantStatus: 400,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := &chain{}
			for i, e := range tc.inner {
				in.Backends = append(in.Backends, backend{Model: "inner" + strconv.Itoa(i), Call: newFake("x", always(e)).Call})
			}
			out := &chain{Backends: []backend{{Model: "outer", Call: in.Do}}}

			_, err := out.Do(context.Background(), "hi")
			attempts := exhausted(t, err)
			if len(attempts) != 1 {
				t.Fatalf("outer attempts = %d, want 1", len(attempts))
			}
			got := attempts[0]
			if got.Kind != tc.wantKind || got.Status != tc.wantStatus || !cmp.Equal(got.RawText, tc.wantRaw) {
				t.Errorf("outer record Kind, Status, RawText = %v, %d, %v, want %v, %d, %v",
					got.Kind, got.Status, deref(got.RawText), tc.wantKind, tc.wantStatus, deref(tc.wantRaw))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return strconv.Quote(*s)
}

// A well-formed retry-after too large for a Duration saturates; only
// negative or malformed ones are ignored.
func TestParseRetryAfterSaturates(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const maxDur = time.Duration(math.MaxInt64)
	tests := []struct {
		name   string
		header string
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"seconds_below_2_62ns", "Retry-After", "4611686018", 4611686018 * time.Second, true},
		{"seconds_at_2_62ns", "Retry-After", "4611686019", 4611686019 * time.Second, true},
		{"seconds_past_duration", "Retry-After", "9223372037", maxDur, true},
		{"seconds_past_uint64", "Retry-After", "99999999999999999999999", maxDur, true},
		{"date_9999", "Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT", maxDur, true},
		{"ms_past_2_62ns", "Retry-After-Ms", "4611686018428", 4611686018428 * ms, true},
		{"ms_past_duration", "Retry-After-Ms", "9223372036855", maxDur, true},
		{"negative", "Retry-After", "-1", 0, false},
		{"malformed", "Retry-After", "soon", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			h.Set(tc.header, tc.value)
			got, ok := llmretry.ParseRetryAfter(h, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("ParseRetryAfter(%s: %s) = %v, %t, want %v, %t", tc.header, tc.value, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
