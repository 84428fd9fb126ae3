package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
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

// verdictErr is an error from some other library that gives its own advice
// and says whether it is a timeout.
type verdictErr struct{ retry, timeout bool }

func (e *verdictErr) Error() string {
	return fmt.Sprintf("verdict retry=%t timeout=%t", e.retry, e.timeout)
}
func (e *verdictErr) ItemRetryable() bool { return e.retry }
func (e *verdictErr) Timeout() bool       { return e.timeout }

// duckAdvice probes err as a consumer that does not import llmretry does:
// with its own interface type. found is false when nothing answers.
func duckAdvice(err error) (retry, found bool) {
	var p interface{ ItemRetryable() bool }
	if errors.As(err, &p) {
		return p.ItemRetryable(), true
	}
	return true, false
}

// duckTimeout probes err for Timeout as net.Error users do.
func duckTimeout(err error) (timeout, found bool) {
	var p interface{ Timeout() bool }
	if errors.As(err, &p) {
		return p.Timeout(), true
	}
	return false, false
}

// A Cancelled answers for itself: a sibling's error as its cause (as
// errgroup sets it) gives no advice and no Timeout through it.
func TestDoCancelledAnswersAtTheTop(t *testing.T) {
	truncated := llmretry.Exhaust([]llmretry.Attempt{{Model: "s", Try: 1, Kind: llmretry.KindTruncated, Err: llmretry.Truncation("x")}})
	timedOut := llmretry.Exhaust([]llmretry.Attempt{{Model: "s", Try: 1, Kind: llmretry.KindTimeout, Err: context.DeadlineExceeded}})
	tests := []struct {
		name  string
		cause error
	}{
		{"sibling_truncated", truncated},
		{"sibling_timed_out", timedOut},
		{"foreign_advice_and_timeout", &verdictErr{retry: false, timeout: true}},
		{"wrapped_foreign", fmt.Errorf("item 7: %w", &verdictErr{retry: false, timeout: true})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				a := newFake("a", func(ctx context.Context, _ int) error {
					cancel(tc.cause) // a sibling failed while this call was under way
					return hang(ctx, 0)
				})
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10 * ms)}}}

				_, err := c.Do(ctx, "hi")
				var cancelled *llmretry.Cancelled
				if !errors.As(err, &cancelled) {
					t.Fatalf("Do() = %v (%T), want a *Cancelled", err, err)
				}
				if retry, found := duckAdvice(err); !found || !retry {
					t.Errorf("duck-typed ItemRetryable probe = %t (found %t), want true (found true)", retry, found)
				}
				if timeout, found := duckTimeout(err); !found || timeout {
					t.Errorf("duck-typed Timeout probe = %t (found %t), want false (found true)", timeout, found)
				}
				if !llmretry.RetryItem(err) {
					t.Errorf("RetryItem() = false, want true")
				}
				var ex *llmretry.Exhausted
				if errors.As(err, &ex) {
					t.Errorf("errors.As(*Cancelled, *Exhausted) = true, want false")
				}
				// The cause is a field, not part of the tree.
				if errors.Is(err, tc.cause) || !errors.Is(err, context.Canceled) {
					t.Errorf("errors.Is(err, cause), errors.Is(err, context.Canceled) = %t, %t, want false, true",
						errors.Is(err, tc.cause), errors.Is(err, context.Canceled))
				}
			})
		})
	}
}

// Each of the four error types declares its own advice, whatever its
// attempts' errors say and whatever the backend order.
func TestErrorTypesAnswerForThemselves(t *testing.T) {
	rejected := func(retry bool) error {
		return llmretry.StatusFailure(400, nil, &verdictErr{retry: retry})
	}
	transient := func(retry bool) error {
		return llmretry.StatusFailure(503, nil, &verdictErr{retry: retry})
	}
	tests := []struct {
		name      string
		errs      []error // backend i fails with errs[i]
		deadline  bool    // a backend runs into the caller's deadline
		wantType  string
		wantRetry bool
	}{
		{name: "rejected_rejected", errs: []error{rejected(true), rejected(true)}, wantType: "*llmretry.Exhausted", wantRetry: false},
		{name: "rejected_transient", errs: []error{rejected(false), transient(false)}, wantType: "*llmretry.Exhausted", wantRetry: true},
		{name: "transient_rejected", errs: []error{transient(false), rejected(false)}, wantType: "*llmretry.Exhausted", wantRetry: true},
		{name: "truncated_transient", errs: []error{llmretry.Truncation("part"), transient(true)}, wantType: "*llmretry.Truncated", wantRetry: false},
		{name: "rejected_then_timeout", errs: []error{rejected(false), &llmretry.Failure{Kind: llmretry.KindTimeout, Err: &verdictErr{retry: false}}}, wantType: "*llmretry.TimedOut", wantRetry: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &chain{}
			for i, e := range tc.errs {
				c.Backends = append(c.Backends, backend{Model: strconv.Itoa(i), Call: newFake(strconv.Itoa(i), always(e)).Call})
			}
			_, err := c.Do(context.Background(), "hi")
			if got := fmt.Sprintf("%T", err); got != tc.wantType {
				t.Fatalf("Do() = %v (%s), want a %s", err, got, tc.wantType)
			}
			if got := llmretry.RetryItem(err); got != tc.wantRetry {
				t.Errorf("RetryItem() = %t, want %t", got, tc.wantRetry)
			}
			if got, found := duckAdvice(err); !found || got != tc.wantRetry {
				t.Errorf("duck-typed probe = %t (found %t), want %t (found true)", got, found, tc.wantRetry)
			}
		})
	}
	// With no attempts there is nothing every backend refused.
	if got := llmretry.RetryItem(&llmretry.Exhausted{}); !got {
		t.Errorf("RetryItem(&Exhausted{}) = false, want true")
	}
}

// A TimedOut keeps the caller's cause and still matches
// context.DeadlineExceeded, whether the deadline passed during an attempt
// or between attempts.
func TestDoTimedOutKeepsCallerCause(t *testing.T) {
	errTurnBudget := errors.New("turn budget spent")
	tests := []struct {
		name  string
		cause error // nil: a plain deadline
		reply func(context.Context, int) error
		hook  time.Duration // how long OnAttempt takes
	}{
		{name: "during_attempt", cause: errTurnBudget, reply: hang},
		{name: "between_attempts", cause: errTurnBudget, reply: always(busy("busy")), hook: 2 * time.Second},
		{name: "plain_during_attempt", reply: hang},
		{name: "plain_between_attempts", reply: always(busy("busy")), hook: 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeoutCause(context.Background(), time.Second, tc.cause)
				defer cancel()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: newFake("a", tc.reply).Call, Retry: llmretry.Policy{Waits: []time.Duration{0}, Reserve: -1}}},
					OnAttempt: func(context.Context, llmretry.Attempt) { time.Sleep(tc.hook) },
				}

				_, err := c.Do(ctx, "hi")
				var to *llmretry.TimedOut
				if !errors.As(err, &to) {
					t.Fatalf("Do() = %v (%T), want a *TimedOut", err, err)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("errors.Is(err, context.DeadlineExceeded) = false, want true")
				}
				if tc.cause != nil && !errors.Is(err, tc.cause) {
					t.Errorf("errors.Is(err, %v) = false, want true", tc.cause)
				}
				if to.Cause != tc.cause {
					t.Errorf("TimedOut.Cause = %v, want %v", to.Cause, tc.cause)
				}
			})
		})
	}
}

// The summary's first line names the lever that matches what happened.
func TestErrorNamesTheRightLever(t *testing.T) {
	const s = time.Second
	delivered := func(ctx context.Context, _ int) error {
		llmretry.Delivered(ctx)
		return busy("stream broke")
	}
	h := http.Header{}
	h.Set("Retry-After", "600")
	limited := llmretry.StatusFailure(429, h, errors.New("slow down"))
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		backends func() []backend
		want     []string // in the first line
		wantNot  []string
	}{
		{
			name: "delivered",
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake("a", delivered).Call, Retry: waits(0)}, {Model: "b", Call: newFake("b", answers).Call}}
			},
			want:    []string{"output was already delivered, so nothing was resent and no other backend was tried"},
			wantNot: []string{"widen the retry waits", "raise the deadline"},
		},
		{
			name:     "reserve",
			deadline: 10 * s,
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake("a", always(busy("busy"))).Call, Retry: waits(6 * s)}}
			},
			want:    []string{"reserve"},
			wantNot: []string{"widen the retry waits"},
		},
		{
			name: "max_wait",
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake("a", always(limited)).Call, Retry: waits(s)}}
			},
			want:    []string{"MaxWait"},
			wantNot: []string{"widen the retry waits", "raise the deadline"},
		},
		{
			// No deadline was set: a per-attempt Timeout is the lever.
			name: "attempt_timeout_without_deadline",
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake("a", hang).Call, Timeout: s}}
			},
			want:    []string{"Timeout"},
			wantNot: []string{"raise the deadline"},
		},
		{
			name:     "deadline",
			deadline: 10 * s,
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake("a", hang).Call}}
			},
			want: []string{"raise the deadline"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				c := &chain{Backends: tc.backends()}
				_, err := c.Do(ctx, "hi")
				if err == nil {
					t.Fatal("Do() = nil error, want one")
				}
				first := firstLine(err.Error())
				for _, w := range tc.want {
					if !strings.Contains(first, w) {
						t.Errorf("first line = %q, want it to contain %q", first, w)
					}
				}
				for _, w := range tc.wantNot {
					if strings.Contains(first, w) {
						t.Errorf("first line = %q, want it not to contain %q", first, w)
					}
				}
			})
		})
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// A nested chain's summary indents its inner attempts under the outer
// attempt that ran them.
func TestErrorIndentsNestedAttempts(t *testing.T) {
	in := &chain{Backends: []backend{
		{Model: "inner-a", Call: newFake("x", always(busy("a busy"))).Call},
		{Model: "inner-b", Call: newFake("y", always(busy("b busy"))).Call},
	}}
	out := &chain{Backends: []backend{
		{Model: "outer", Call: in.Do},
		{Model: "last", Call: newFake("z", always(busy("z busy"))).Call},
	}}

	_, err := out.Do(context.Background(), "hi")
	attempts := exhausted(t, err)
	inner := exhausted(t, attempts[0].Err)
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		lines[0],
		"\t" + attempts[0].String(),
		"\t\t" + inner[0].String(),
		"\t\t" + inner[1].String(),
		"\t" + attempts[1].String(),
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("Error() lines (-want +got):\n%s", diff)
	}
}

// The summary lists 20 attempts in full, and from 21 on leaves the middle
// out.
func TestErrorListsAtMostTwentyAttempts(t *testing.T) {
	tests := []struct {
		n        int
		wantLine string // the line after the first ten; "" when all are listed
	}{
		{n: 20},
		{n: 21, wantLine: "\t... 1 more attempt left out"},
		{n: 22, wantLine: "\t... 2 more attempts left out"},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.n), func(t *testing.T) {
			t.Parallel()
			attempts := make([]llmretry.Attempt, tc.n)
			for i := range attempts {
				attempts[i] = llmretry.Attempt{Model: "a", Try: i + 1, Kind: llmretry.KindTransient, Err: fmt.Errorf("failure %d", i+1)}
			}
			lines := strings.Split(llmretry.Exhaust(attempts).Error(), "\n")
			want := []string{lines[0]}
			for i, at := range attempts {
				if tc.wantLine != "" && i >= 10 && i < tc.n-10 {
					if i == 10 {
						want = append(want, tc.wantLine)
					}
					continue
				}
				want = append(want, "\t"+at.String())
			}
			if diff := cmp.Diff(want, lines); diff != "" {
				t.Errorf("Error() lines (-want +got):\n%s", diff)
			}
		})
	}
}

// A call cancelled because a sibling timed out was cancelled; it did not
// time out itself, so its Cause must not make it match
// context.DeadlineExceeded. It still matches context.Canceled, and nothing
// of the cause: that is a field to read.
func TestCancelledCauseIsNotDeadline(t *testing.T) {
	var sibling error
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), sec)
		defer cancel()
		slow := &chain{Backends: []backend{{Model: "slow", Call: newFake("slow", hang).Call}}}
		_, sibling = slow.Do(ctx, "sibling")
	})
	if !isTimedOut(sibling) {
		t.Fatalf("sibling: Do() error = %v (%T), want a *TimedOut", sibling, sibling)
	}
	tests := []struct {
		name  string
		cause error
	}{
		{name: "sibling_timed_out", cause: sibling},
		{name: "deadline_exceeded", cause: context.DeadlineExceeded},
		{name: "wrapped_deadline", cause: fmt.Errorf("sibling: %w", context.DeadlineExceeded)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(tc.cause)
			c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", answers).Call}}}
			_, err := c.Do(ctx, "hi")
			var cn *llmretry.Cancelled
			if !errors.As(err, &cn) || cn.Cause != tc.cause {
				t.Fatalf("Do() = %v (%T), want a *Cancelled with Cause %v", err, err, tc.cause)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("errors.Is(err, context.DeadlineExceeded) = true, want false")
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("errors.Is(err, context.Canceled) = false, want true")
			}
			if errors.Is(err, tc.cause) {
				t.Errorf("errors.Is(err, cause) = true, want false")
			}
		})
	}
}

// A backend that wraps an inner chain's error in a Failure of its own
// still ran the inner attempts: the outer summary indents them under the
// outer attempt.
func TestSummaryIndentsInnerAttemptsThroughFailure(t *testing.T) {
	i1 := newFake("i1", always(busy("inner down")))
	i2 := newFake("i2", always(busy("inner down")))
	inner := &chain{Backends: []backend{{Model: "i1", Call: i1.Call}, {Model: "i2", Call: i2.Call}}}
	run := func(ctx context.Context, req string) (string, error) {
		resp, err := inner.Do(ctx, req)
		if err != nil {
			return "", &llmretry.Failure{Kind: llmretry.KindTransient, Err: err}
		}
		return resp, nil
	}
	outer := &chain{Backends: []backend{{Model: "outer", Call: run}}}
	_, err := outer.Do(context.Background(), "hi")
	want := "llmretry: exhausted after 1 attempt on 1 backend: every backend failed; add a backend or widen the retry waits" +
		"\n\t[backend 0 outer try 1] transient: llmretry: exhausted after 2 attempts on 2 backends: every backend failed; add a backend or widen the retry waits (stopping: waits_used)" +
		"\n\t\t[backend 0 i1 try 1] http 503: inner down (failing over: waits_used)" +
		"\n\t\t[backend 1 i2 try 1] http 503: inner down (stopping: waits_used)"
	if err == nil || err.Error() != want {
		t.Errorf("Do() error =\n%v\nwant\n%s", err, want)
	}
}

// causeErr is a caller's own cancellation cause, matched with errors.As.
type causeErr struct{ item int }

func (e *causeErr) Error() string { return "item failed" }

// A context cancelled with a chain error as its cause — as errgroup does
// with the first sibling's error — gives a Cancelled that is still not an
// Exhausted, and carries no advice from the sibling: the cause is a field,
// and nothing of it is in the error's tree, a cause of the caller's own
// type included.
func TestDoCancelledCauseIsShielded(t *testing.T) {
	sibling := llmretry.Exhaust([]llmretry.Attempt{{Model: "a", Try: 1, Kind: llmretry.KindTruncated, Err: llmretry.Truncation("x")}})
	tests := []struct {
		name  string
		cause error
	}{
		{"truncated_sibling", sibling},
		{"wrapped_sibling", &wrapper{sibling}},
		{"own_cause_type", &causeErr{item: 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(tc.cause)
			c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", answers).Call}}}

			_, err := c.Do(ctx, "hi")
			var cancelled *llmretry.Cancelled
			if !errors.As(err, &cancelled) {
				t.Fatalf("Do() = %v, want a *Cancelled", err)
			}
			if cancelled.Cause != tc.cause {
				t.Errorf("Cause = %v, want %v", cancelled.Cause, tc.cause)
			}
			if errors.Is(err, tc.cause) || !errors.Is(err, context.Canceled) {
				t.Errorf("errors.Is(err, cause) = %t, errors.Is(err, context.Canceled) = %t, want false, true",
					errors.Is(err, tc.cause), errors.Is(err, context.Canceled))
			}
			var ex *llmretry.Exhausted
			var tr *llmretry.Truncated
			if errors.As(err, &ex) || errors.As(err, &tr) {
				t.Errorf("errors.As(err, *Exhausted or *Truncated) = true for a *Cancelled, want false")
			}
			if !llmretry.RetryItem(err) {
				t.Errorf("RetryItem(%v) = false, want true: a cancelled item may run again", err)
			}
			if got := llmretry.Classify(err); got != llmretry.KindCancelled {
				t.Errorf("Classify() = %v, want %v", got, llmretry.KindCancelled)
			}
			var own *causeErr
			if errors.As(err, &own) {
				t.Errorf("errors.As(err, *causeErr) = true, want false: read the Cause field")
			}
		})
	}
}

// wrapper is a layer's own error type over ours.
type wrapper struct{ err error }

func (w *wrapper) Error() string { return "layer: " + w.err.Error() }
func (w *wrapper) Unwrap() error { return w.err }

// When the caller's deadline runs out between attempts after a
// truncation, the Truncated summary names both levers.
func TestDoTruncatedThenDeadlineNamesBothLevers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		b := newFake("b", answers)
		c := &chain{
			Backends: []backend{
				{Model: "a", Call: newFake("a", always(llmretry.Truncation("partial"))).Call},
				{Model: "b", Call: b.Call},
			},
			// A slow hook: the deadline passes before backend b's turn.
			OnAttempt: func(context.Context, llmretry.Attempt) { time.Sleep(2 * time.Second) },
		}

		_, err := c.Do(ctx, "hi")
		var tr *llmretry.Truncated
		if !errors.As(err, &tr) {
			t.Fatalf("Do() = %v, want a *Truncated", err)
		}
		first, _, _ := strings.Cut(err.Error(), "\n")
		for _, lever := range []string{"raise the completion budget (max tokens)", "raise the deadline"} {
			if !strings.Contains(first, lever) {
				t.Errorf("summary %q does not name %q", first, lever)
			}
		}
		if n := len(b.times()); n != 0 {
			t.Errorf("backend b called %d times, want 0", n)
		}
	})
}
