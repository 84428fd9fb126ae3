package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// lastErr returns the Err of the last record of one of the chain's
// errors: where the last provider error is kept, since no attempt's error
// is in the chain's error tree. nil when err has no records.
func lastErr(err error) error {
	attempts := chainRecords(err)
	if len(attempts) == 0 {
		return nil
	}
	return attempts[len(attempts)-1].Err
}

// chainRecords returns the records of one of the chain's errors.
func chainRecords(err error) []llmretry.Attempt {
	var ex *llmretry.Exhausted
	var ca *llmretry.Cancelled
	switch {
	case errors.As(err, &ex):
		return ex.Attempts
	case errors.As(err, &ca):
		return ca.Attempts
	}
	return nil
}

// lastErrIs reports whether the last record's Err matches target.
func lastErrIs(err, target error) bool { return errors.Is(lastErr(err), target) }

// verdict is what a caller's errors.Is, errors.As and advice probes
// answer for an error that Do returned.
type verdict struct {
	Canceled, Deadline, Cause, Sentinel       bool // errors.Is: context.Canceled, context.DeadlineExceeded, the case's cause, errSentinel
	Exhausted, Truncated, TimedOut, Cancelled bool // errors.As
	Failure, Config, Timeout                  bool // errors.As *Failure; errors.Is ErrConfig; a Timeout() probe answering true
	RetryItem                                 bool
	RetryAfter                                time.Duration
	RetryAfterOK                              bool
	Kind                                      llmretry.Kind
}

// errSentinel is a caller's own sentinel, returned by a backend.
var errSentinel = errors.New("my sentinel")

// verdictOf asks err every question a caller may route on.
func verdictOf(err, cause error) verdict {
	var (
		ex *llmretry.Exhausted
		tr *llmretry.Truncated
		to *llmretry.TimedOut
		ca *llmretry.Cancelled
		fa *llmretry.Failure
		tp interface{ Timeout() bool }
	)
	v := verdict{
		Canceled:  errors.Is(err, context.Canceled),
		Deadline:  errors.Is(err, context.DeadlineExceeded),
		Cause:     cause != nil && errors.Is(err, cause),
		Sentinel:  errors.Is(err, errSentinel),
		Exhausted: errors.As(err, &ex),
		Truncated: errors.As(err, &tr),
		TimedOut:  errors.As(err, &to),
		Cancelled: errors.As(err, &ca),
		Failure:   errors.As(err, &fa),
		Config:    errors.Is(err, llmretry.ErrConfig),
		Timeout:   errors.As(err, &tp) && tp.Timeout(),
		RetryItem: llmretry.RetryItem(err),
		Kind:      llmretry.Classify(err),
	}
	v.RetryAfter, v.RetryAfterOK = llmretry.RetryItemAfter(err)
	return v
}

// What errors.Is and errors.As answer for the errors Do returns: the
// chain's outcome, and nothing of an attempt's error or of a cause. Each
// case is a real Do call in virtual time.
func TestErrorsAnswerTheOutcome(t *testing.T) {
	sibling400 := llmretry.StatusFailure(400, nil, errors.New("bad request"))
	siblingExhausted := llmretry.Exhaust([]llmretry.Attempt{{Model: "s", Try: 1, Kind: llmretry.KindRejected, Status: 400, Err: sibling400, Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable}})
	siblingTruncated := llmretry.Exhaust([]llmretry.Attempt{{Model: "s", Try: 1, Kind: llmretry.KindTruncated, Err: llmretry.Truncation("x"), Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable}})
	errBudget := errors.New("request budget spent")

	// cancelledBy runs a call whose context a sibling cancels with cause
	// while the call is under way, as errgroup does.
	cancelledBy := func(cause error) func(t *testing.T) error {
		return func(t *testing.T) error {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			time.AfterFunc(100*ms, func() { cancel(cause) })
			c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call, Retry: waits(time.Second)}}}
			_, err := c.Do(ctx, "hi")
			return err
		}
	}
	// timedOutBy runs a call whose deadline, with cause, passes while a
	// backend hangs.
	timedOutBy := func(cause error) func(t *testing.T) error {
		return func(t *testing.T) error {
			ctx, cancel := context.WithTimeoutCause(context.Background(), time.Second, cause)
			defer cancel()
			c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call}}}
			_, err := c.Do(ctx, "hi")
			return err
		}
	}
	// failing runs a one-backend call whose backend returns err.
	failing := func(err error) func(t *testing.T) error {
		return func(t *testing.T) error {
			c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", always(err)).Call}}}
			_, got := c.Do(context.Background(), "hi")
			return got
		}
	}
	exhausted := verdict{Exhausted: true, RetryItem: true}
	timedOut := verdict{Deadline: true, Exhausted: true, TimedOut: true, Timeout: true, RetryItem: true, Kind: llmretry.KindTimeout}
	cancelled := verdict{Canceled: true, Cancelled: true, RetryItem: true, Kind: llmretry.KindCancelled}
	with := func(v verdict, f func(*verdict)) verdict { f(&v); return v }

	tests := []struct {
		name  string
		do    func(t *testing.T) error
		cause error // asked with errors.Is, and expected in the Cause field
		want  verdict
	}{
		{
			// net/http and both SDKs return ctx.Err() when their context
			// ends: for a stall that is context.Canceled, cause ErrStalled.
			name: "stall_client_returns_ctx_err",
			do: func(t *testing.T) error {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", hang).Call, StallTimeout: 300 * ms}}}
				_, err := c.Do(context.Background(), "hi")
				return err
			},
			want: timedOut,
		},
		{
			// A backend that calls it transient: a Failure over
			// context.Canceled while the caller's context is live.
			name: "attempt_failure_wraps_canceled",
			do:   failing(&llmretry.Failure{Kind: llmretry.KindTransient, Err: fmt.Errorf("stream: %w", context.Canceled)}),
			want: with(exhausted, func(v *verdict) { v.Kind = llmretry.KindTransient }),
		},
		{
			// A client that reports a withdrawal: the chain takes it as one.
			name: "attempt_returns_wrapped_canceled",
			do:   failing(fmt.Errorf("stream closed: %w", context.Canceled)),
			want: cancelled,
		},
		{
			name: "attempt_failure_400",
			do:   failing(sibling400),
			want: with(exhausted, func(v *verdict) { v.RetryItem, v.Kind = false, llmretry.KindRejected }),
		},
		{
			name: "attempt_failure_503_hint",
			do: func(t *testing.T) error {
				h := http.Header{}
				h.Set("Retry-After", "30")
				return failing(llmretry.StatusFailure(503, h, errSentinel))(t)
			},
			want: with(exhausted, func(v *verdict) { v.RetryAfter, v.RetryAfterOK, v.Kind = 30*time.Second, true, llmretry.KindTransient }),
		},
		{
			name: "attempt_sentinel",
			do:   failing(fmt.Errorf("tool: %w", errSentinel)),
			want: exhausted,
		},
		{
			name: "attempt_config_error",
			do:   failing(fmt.Errorf("adapter: %w", llmretry.ErrConfig)),
			want: exhausted,
		},
		{name: "cancel_cause_sibling_failure", do: cancelledBy(sibling400), cause: sibling400, want: cancelled},
		{name: "cancel_cause_sibling_exhausted", do: cancelledBy(siblingExhausted), cause: siblingExhausted, want: cancelled},
		{name: "cancel_cause_sibling_truncated", do: cancelledBy(siblingTruncated), cause: siblingTruncated, want: cancelled},
		{name: "cancel_cause_wrapped_sibling", do: cancelledBy(fmt.Errorf("item 7: %w", siblingTruncated)), cause: siblingTruncated, want: cancelled},
		{
			name: "deadline_cause",
			do:   timedOutBy(errBudget), cause: errBudget,
			want: with(timedOut, func(v *verdict) { v.Cause = true }),
		},
		{
			// The cause matches itself, not what it wraps: not
			// context.Canceled, and errors.As finds no Failure in it.
			name: "deadline_cause_wraps_canceled_and_failure",
			do:   timedOutBy(fmt.Errorf("budget: %w", errors.Join(context.Canceled, sibling400, errSentinel))),
			want: timedOut,
		},
		{name: "deadline_cause_is_failure", do: timedOutBy(sibling400), cause: sibling400, want: with(timedOut, func(v *verdict) { v.Cause = true })},
		{name: "deadline_plain", do: timedOutBy(context.DeadlineExceeded), want: timedOut},
		{
			name: "config",
			do: func(t *testing.T) error {
				_, err := (&chain{}).Do(context.Background(), "hi")
				return err
			},
			want: verdict{Config: true},
		},
		{
			// A backend that wraps an inner chain's error is classified by
			// the inner outcome, found beneath the backend's wrapping: the
			// inner stall timed out, whatever its client returned.
			name: "nested_inner_stall",
			do: func(t *testing.T) error {
				inner := &chain{Backends: []backend{{Model: "inner", Call: newFake("i", hang).Call, StallTimeout: 300 * ms}}}
				outer := &chain{Backends: []backend{{Model: "outer", Call: func(ctx context.Context, req string) (string, error) {
					resp, err := inner.Do(ctx, req)
					if err != nil {
						return "", fmt.Errorf("agent step: %w", err)
					}
					return resp, nil
				}}}}
				_, err := outer.Do(context.Background(), "hi")
				return err
			},
			want: timedOut,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				err := tc.do(t)
				if err == nil {
					t.Fatal("Do() = nil error, want one")
				}
				if diff := cmp.Diff(tc.want, verdictOf(err, tc.cause)); diff != "" {
					t.Errorf("Do() = %v (%T): answers (-want +got):\n%s", err, err, diff)
				}
				// The cause is kept, as a field to read.
				if tc.cause != nil {
					var ca *llmretry.Cancelled
					var to *llmretry.TimedOut
					got := error(nil)
					switch {
					case errors.As(err, &ca):
						got = ca.Cause
					case errors.As(err, &to):
						got = to.Cause
					}
					if !errors.Is(got, tc.cause) {
						t.Errorf("Do() Cause = %v, want %v", got, tc.cause)
					}
				}
				// Exhaust, given the records of an Exhausted, returns what
				// Do returned.
				var ex *llmretry.Exhausted
				if recs := chainRecords(err); len(recs) > 0 && errors.As(err, &ex) {
					if got := llmretry.Exhaust(recs); fmt.Sprintf("%T", got) != fmt.Sprintf("%T", err) {
						t.Errorf("Exhaust(records) = %T, want %T as Do returned", got, err)
					}
				}
				// Wrapped once more by the caller, it answers the same.
				if diff := cmp.Diff(tc.want, verdictOf(fmt.Errorf("handler: %w", err), tc.cause)); diff != "" {
					t.Errorf("wrapped Do() error: answers (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A deadline that ends a wait for a breaker leaves a skip that says so,
// and Exhaust, given the records, answers as Do did: a *TimedOut, though
// no attempt sent timed out.
func TestExhaustAgreesWithDoOnBreakerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{Failures: 1, Cooldown: time.Second}
		probe := make(chan struct{})
		a := newFake("a", func(ctx context.Context, n int) error {
			if n == 2 {
				close(probe)
				<-ctx.Done() // the half-open probe hangs until its caller gives up
				return ctx.Err()
			}
			return busy("down")
		})
		// No reserve, and tries enough: the wait for the breaker may last
		// until the deadline.
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br, Retry: llmretry.Policy{Waits: []time.Duration{time.Second}, Reserve: -1, MaxTries: 10}}}}
		once := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		if _, err := once.Do(context.Background(), "opens"); err == nil {
			t.Fatal("first Do() = nil error, want the failure that opens the breaker")
		}
		time.Sleep(time.Second) // the breaker half-opens
		probeCtx, stopProbe := context.WithCancel(context.Background())
		defer stopProbe()
		go c.Do(probeCtx, "probe")
		<-probe

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Do(ctx, "waits")
		var to *llmretry.TimedOut
		if !errors.As(err, &to) {
			t.Fatalf("Do() = %v (%T), want a *TimedOut", err, err)
		}
		recs := to.Attempts
		if n := len(recs); n == 0 || !recs[n-1].Skipped || recs[n-1].Why != llmretry.WhyDeadline {
			t.Fatalf("Do() records = %v, want a last skip stopped by the deadline", recs)
		}
		if got := llmretry.Exhaust(recs); fmt.Sprintf("%T", got) != fmt.Sprintf("%T", err) {
			t.Errorf("Exhaust(records) = %T, want %T as Do returned", got, err)
		}
		stopProbe()
	})
}

// uncomparable is an error type that == cannot compare.
type uncomparable []string

func (u uncomparable) Error() string { return "uncomparable" }

// A TimedOut matches its Cause by identity, and a Cause of a type that ==
// cannot compare matches nothing rather than panic.
func TestTimedOutIsCause(t *testing.T) {
	cause := errors.New("budget")
	tests := []struct {
		name   string
		cause  error
		target error
		want   bool
	}{
		{"itself", cause, cause, true},
		{"deadline", cause, context.DeadlineExceeded, true},
		{"another_with_the_same_text", cause, errors.New("budget"), false},
		{"wrapped_by_the_cause", fmt.Errorf("x: %w", cause), cause, false},
		{"canceled_in_the_cause", fmt.Errorf("x: %w", context.Canceled), context.Canceled, false},
		{"nil_cause", nil, cause, false},
		{"uncomparable_cause", uncomparable{"a"}, uncomparable{"a"}, false},
		{"uncomparable_target", cause, uncomparable{"a"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := &llmretry.TimedOut{Cause: tc.cause}
			if got := errors.Is(err, tc.target); got != tc.want {
				t.Errorf("errors.Is(TimedOut{Cause: %v}, %v) = %t, want %t", tc.cause, tc.target, got, tc.want)
			}
		})
	}
}
