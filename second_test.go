package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
)

// The tests in this file each pin one defect that review found in the
// core: each fails against the code before its fix.

// A zero Reserve under a short deadline is half of what the caller had
// left, so retries still happen; an explicit Reserve is used as given.
func TestDoReserveUnderShortDeadline(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name      string
		deadline  time.Duration
		policy    llmretry.Policy
		wantCalls []time.Duration
		want      string // Do's answer; "" when it fails
	}{
		{
			// The case: nothing was retried under a 30s deadline.
			name:      "30s_zero_waits_retried",
			deadline:  30 * s,
			policy:    waits(0, 100*ms, 500*ms),
			wantCalls: []time.Duration{0, 0, 100 * ms, 600 * ms},
			want:      "a: hi",
		},
		{
			// 30s reserves 15s: a 15s wait leaves exactly that.
			name:      "30s_reserves_15s",
			deadline:  30 * s,
			policy:    waits(15 * s),
			wantCalls: []time.Duration{0, 15 * s},
		},
		{
			name:      "30s_reserves_no_less_than_15s",
			deadline:  30 * s,
			policy:    waits(15*s + 1),
			wantCalls: []time.Duration{0},
		},
		{
			// 2s reserves 1s: the second wait leaves exactly 1s.
			name:      "2s_reserves_1s",
			deadline:  2 * s,
			policy:    waits(500*ms, 500*ms),
			wantCalls: []time.Duration{0, 500 * ms, s},
		},
		{
			name:      "2s_reserves_no_less_than_1s",
			deadline:  2 * s,
			policy:    waits(500*ms, 501*ms),
			wantCalls: []time.Duration{0, 500 * ms},
		},
		{
			// 10 min reserves DefaultReserve, not half.
			name:      "10min_reserves_60s",
			deadline:  10 * time.Minute,
			policy:    waits(540 * s),
			wantCalls: []time.Duration{0, 540 * s},
		},
		{
			name:      "10min_reserves_no_less_than_60s",
			deadline:  10 * time.Minute,
			policy:    waits(540*s + 1),
			wantCalls: []time.Duration{0},
		},
		{
			// Used as given, though it is more than half of 30s.
			name:      "explicit_reserve",
			deadline:  30 * s,
			policy:    llmretry.Policy{Waits: []time.Duration{5 * s, 5 * s}, Reserve: 20 * s},
			wantCalls: []time.Duration{0, 5 * s, 10 * s},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				a := newFake("a", script(busy("1"), busy("2"), busy("3")))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy}}}

				got, err := c.Do(ctx, "hi")
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("call times (-want +got):\n%s", diff)
				}
				if tc.want != "" && (got != tc.want || err != nil) {
					t.Errorf("Do() = %q, %v, want %q, nil", got, err, tc.want)
				}
				if tc.want == "" && err == nil {
					t.Errorf("Do() = %q, nil, want an error", got)
				}
			})
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

// Each attempt's Start is when its request was sent and its Elapsed covers
// its Call only: time in OnAttempt is charged to no attempt.
func TestDoHookTimeNotChargedToAttempts(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name   string
		policy llmretry.Policy
		want   []time.Duration // Start of each attempt, from Do's start
	}{
		// 50ms call, 2s hook, then what is left of the wait, measured from
		// the attempt's end (Chain.OnAttempt): nothing of a 100ms wait.
		{name: "zero_wait_then_fail_over", policy: waits(0), want: []time.Duration{0, 2050 * ms, 4100 * ms}},
		{name: "timed_wait_then_fail_over", policy: waits(100 * ms), want: []time.Duration{0, 2050 * ms, 4100 * ms}},
		{name: "long_wait_then_fail_over", policy: waits(3 * s), want: []time.Duration{0, 3050 * ms, 5100 * ms}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				slow := func(err error) func(context.Context, int) error {
					return func(context.Context, int) error {
						time.Sleep(50 * ms)
						return err
					}
				}
				a, b := newFake("a", slow(busy("busy"))), newFake("b", slow(nil))
				var seen []llmretry.Attempt
				c := &chain{
					Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy}, {Model: "b", Call: b.Call}},
					OnAttempt: func(_ context.Context, at llmretry.Attempt) {
						seen = append(seen, at)
						time.Sleep(2 * s)
					},
				}

				if got, err := c.Do(context.Background(), "hi"); got != "b: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: hi")
				}
				var starts, elapsed []time.Duration
				for _, at := range seen {
					starts = append(starts, at.Start.Sub(start))
					elapsed = append(elapsed, at.Elapsed)
				}
				if diff := cmp.Diff(tc.want, starts); diff != "" {
					t.Errorf("attempt starts (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]time.Duration{50 * ms, 50 * ms, 50 * ms}, elapsed); diff != "" {
					t.Errorf("attempt Elapsed (-want +got):\n%s", diff)
				}
			})
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

// ErrAttemptTimeout is recognisable inside the errors an HTTP client
// builds from it.
func TestErrAttemptTimeout(t *testing.T) {
	if !errors.Is(llmretry.ErrAttemptTimeout, context.DeadlineExceeded) {
		t.Errorf("errors.Is(ErrAttemptTimeout, context.DeadlineExceeded) = false, want true")
	}
	sdk := &url.Error{Op: "Post", URL: "https://api.example/v1", Err: llmretry.ErrAttemptTimeout}
	if got := llmretry.Classify(fmt.Errorf("openai: %w", sdk)); got != llmretry.KindTimeout {
		t.Errorf("Classify(%v) = %v, want %v", sdk, got, llmretry.KindTimeout)
	}
}

// Over real loopback HTTP, net/http reports our per-attempt timeout as the
// context's cause; the record's error is recognisable as a timeout.
func TestDoAttemptTimeoutOverHTTP(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // never answers
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release) // before Close, which waits for the handlers
	call := func(ctx context.Context, _ string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			return "", err
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return "", errors.New("answered")
	}
	c := &chain{Backends: []backend{{Model: "a", Call: call, Timeout: 20 * ms}}}

	_, err := c.Do(context.Background(), "hi")
	attempts := exhausted(t, err)
	got := attempts[0].Err
	if !errors.Is(got, llmretry.ErrAttemptTimeout) || !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("attempt Err = %v, want one matching ErrAttemptTimeout and context.DeadlineExceeded", got)
	}
	if k := llmretry.Classify(got); k != llmretry.KindTimeout {
		t.Errorf("Classify(%v) = %v, want %v", got, k, llmretry.KindTimeout)
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

// A retry after a zero wait says so: RetryIn alone is 0 for "at once" and
// for "not retried".
func TestDoZeroWaitRetrySaysRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("a", always(busy("busy")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(0)}}}

		_, err := c.Do(context.Background(), "hi")
		attempts := exhausted(t, err)
		var got []string
		for _, at := range attempts {
			b, err := json.Marshal(at)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("next=%v why=%v retry_in_ms=%v", m["next"], m["why"], m["retry_in_ms"]))
		}
		want := []string{
			"next=retry why=<nil> retry_in_ms=0",
			"next=stop why=waits_used retry_in_ms=0",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
	})
}

// A wait is decided once, when the attempt ends, and measured from then:
// OnAttempt's time is part of it, and a wait the hook outlasts is over.
// Only the caller's deadline can still cut it short, and then the record
// in the error says so while OnAttempt heard retry.
func TestDoWaitMeasuredFromDecision(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name      string
		reserve   time.Duration
		hook      time.Duration
		wantCalls []time.Duration
		wantEnd   time.Duration // when Do returns, after the last hook
		wantWhy   llmretry.Why  // of the last record in the error
		heard     []llmretry.Next
	}{
		// The 30s wait fits at 0s (70s left, 60s reserve), ends at 30s
		// though the hook took 20s; at 30s the repeat does not fit.
		{name: "hook_within_wait", reserve: 60 * s, hook: 20 * s, wantCalls: []time.Duration{0, 30 * s}, wantEnd: 50 * s, wantWhy: llmretry.WhyReserve, heard: []llmretry.Next{llmretry.NextRetry, llmretry.NextStop}},
		// The hook outlasts the wait: the retry goes when it returns.
		{name: "hook_past_wait", reserve: -1, hook: 80 * s, wantCalls: []time.Duration{0, 80 * s}, wantEnd: 160 * s, wantWhy: llmretry.WhyReserve, heard: []llmretry.Next{llmretry.NextRetry, llmretry.NextStop}},
		// The hook outlasts the deadline: the deadline cuts the wait.
		{name: "hook_past_deadline", reserve: -1, hook: 120 * s, wantCalls: []time.Duration{0}, wantEnd: 120 * s, wantWhy: llmretry.WhyDeadline, heard: []llmretry.Next{llmretry.NextRetry}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 100*s)
				defer cancel()
				a := newFake("a", always(busy("busy")))
				var heard []llmretry.Next
				c := &chain{
					Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{30 * s}, Reserve: tc.reserve}}},
					OnAttempt: func(_ context.Context, at llmretry.Attempt) {
						heard = append(heard, at.Next)
						time.Sleep(tc.hook)
					},
				}

				_, err := c.Do(ctx, "hi")
				if got := time.Since(start); got != tc.wantEnd {
					t.Errorf("Do() returned after %v, want %v", got, tc.wantEnd)
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("call times (-want +got):\n%s", diff)
				}
				if got, want := isTimedOut(err), tc.wantWhy == llmretry.WhyDeadline; got != want {
					t.Errorf("Do() = %T, want a *TimedOut: %t", err, want)
				}
				attempts := exhausted(t, err)
				last := attempts[len(attempts)-1]
				if last.Next != llmretry.NextStop || last.Why != tc.wantWhy || last.RetryIn != 0 {
					t.Errorf("last record Next, Why, RetryIn = %q, %q, %v, want stop, %s, 0", last.Next, last.Why, last.RetryIn, tc.wantWhy)
				}
				if diff := cmp.Diff(tc.heard, heard); diff != "" {
					t.Errorf("OnAttempt heard (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// The outcome of an attempt is the state when it ended: a backend that
// reported cancellation keeps its error as the Cause, though the deadline
// passes during a slow OnAttempt.
func TestDoCancelledCauseFromWhenAttemptEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		withdrawn := fmt.Errorf("stream: %w", context.Canceled)
		c := &chain{
			Backends:  []backend{{Model: "a", Call: newFake("a", always(withdrawn)).Call, Retry: waits(0)}},
			OnAttempt: func(context.Context, llmretry.Attempt) { time.Sleep(2 * time.Second) },
		}

		_, err := c.Do(ctx, "hi")
		var cancelled *llmretry.Cancelled
		if !errors.As(err, &cancelled) {
			t.Fatalf("Do() = %v (%T), want a *Cancelled", err, err)
		}
		if cancelled.Cause != withdrawn {
			t.Errorf("Cause = %v, want the backend's %v", cancelled.Cause, withdrawn)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("errors.Is(err, context.DeadlineExceeded) = true, want false: the attempt ended by withdrawal")
		}
	})
}

// The same holds for the last attempt of a chain that has given up: when
// it ended, the caller's context was live and no try was left, so a
// deadline that passes, or a cancel that comes, while OnAttempt runs does
// not turn the chain's failure into a TimedOut or Cancelled whose records
// show no deadline and no cancel.
func TestDoOutcomeOfLastAttemptIsFixedWhenItEnds(t *testing.T) {
	tests := []struct {
		name string
		hook func(cancel context.CancelFunc)
	}{
		{name: "deadline_passes_in_hook", hook: func(context.CancelFunc) { time.Sleep(2 * time.Second) }},
		{name: "cancel_in_hook", hook: func(cancel context.CancelFunc) { cancel() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: newFake("a", always(busy("busy"))).Call}},
					OnAttempt: func(context.Context, llmretry.Attempt) { tc.hook(cancel) },
				}

				_, err := c.Do(ctx, "hi")
				if got := typeName(err); got != "*llmretry.Exhausted" {
					t.Errorf("Do() = %s %v, want a plain *Exhausted: the chain had given up when the attempt ended", got, err)
				}
				var cancelled *llmretry.Cancelled
				if errors.As(err, &cancelled) {
					return
				}
				attempts := exhausted(t, err)
				if got := stepsOf(attempts); !cmp.Equal(got, []step{{llmretry.NextStop, llmretry.WhyWaitsUsed, 0}}) {
					t.Errorf("records = %v, want one stop: waits_used", got)
				}
			})
		})
	}
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

// A huge retry-after ends the backend's retries like any hint past
// MaxWait, and with no cap is honoured as the longest wait.
func TestDoHugeRetryAfter(t *testing.T) {
	const maxDur = time.Duration(math.MaxInt64)
	tests := []struct {
		name      string
		value     string
		maxWait   time.Duration
		wantCalls int
		wantNext  llmretry.Next
		wantWhy   llmretry.Why
		wantWait  time.Duration // RetryIn
	}{
		{name: "seconds_at_2_62ns", value: "4611686019", wantCalls: 1, wantNext: llmretry.NextStop, wantWhy: llmretry.WhyMaxWait},
		{name: "seconds_below_2_62ns", value: "4611686018", wantCalls: 1, wantNext: llmretry.NextStop, wantWhy: llmretry.WhyMaxWait},
		{name: "date_9999", value: "Fri, 31 Dec 9999 23:59:59 GMT", wantCalls: 1, wantNext: llmretry.NextStop, wantWhy: llmretry.WhyMaxWait},
		// With no cap the hint is the wait. (The bubble's clock may not run
		// a whole Duration past its start, so the call times are not
		// asserted; RetryIn says the wait.)
		{name: "no_cap", value: "4611686019", maxWait: -1, wantCalls: 2, wantNext: llmretry.NextRetry, wantWait: 4611686019 * time.Second},
		{name: "no_cap_saturated", value: "9223372037", maxWait: -1, wantCalls: 2, wantNext: llmretry.NextRetry, wantWait: maxDur},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				h := http.Header{}
				h.Set("Retry-After", tc.value)
				limited := llmretry.StatusFailure(429, h, errors.New("slow down"))
				a := newFake("a", script(limited))
				rec := newRecorder()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{10 * ms}, MaxWait: tc.maxWait}}},
					OnAttempt: rec.OnAttempt,
				}

				c.Do(context.Background(), "hi")
				if got := a.times(); len(got) != tc.wantCalls {
					t.Errorf("calls at %v, want %d calls", got, tc.wantCalls)
				}
				seen, _ := rec.seen()
				if got := seen[0]; got.Next != tc.wantNext || got.Why != tc.wantWhy || got.RetryIn != tc.wantWait {
					t.Errorf("first record Next, Why, RetryIn = %q, %q, %v, want %q, %q, %v", got.Next, got.Why, got.RetryIn, tc.wantNext, tc.wantWhy, tc.wantWait)
				}
				if seen[0].RetryAfter < 4611686018*time.Second {
					t.Errorf("first record RetryAfter = %v, want the hint kept", seen[0].RetryAfter)
				}
			})
		})
	}
}

// Every record the chain can produce decodes to itself, the longest waits
// included.
func TestAttemptJSONRoundTripsExtremes(t *testing.T) {
	const maxDur = time.Duration(math.MaxInt64)
	start := time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		a    llmretry.Attempt
	}{
		{"longest_retry_in", llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: errors.New("slow down"), Start: start, Elapsed: 1, RetryAfter: maxDur, Next: llmretry.NextRetry, RetryIn: maxDur}},
		{"longest_elapsed", llmretry.Attempt{Model: "a", Try: 2, Kind: llmretry.KindTimeout, Err: errors.New("slow"), Start: start, Elapsed: maxDur, Next: llmretry.NextStop, Why: llmretry.WhyDeadline}},
		{"odd_nanoseconds", llmretry.Attempt{Model: "a", Try: 3, Kind: llmretry.KindParse, RawText: ptr(""), Err: errors.New("bad json"), Start: start, Elapsed: 123456789, RetryAfter: 1, Next: llmretry.NextRetry, RetryIn: 987654321}},
		{"success", llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Start: start, Elapsed: 999999, Delivered: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tc.a)
			if err != nil {
				t.Fatalf("json.Marshal() error = %v", err)
			}
			var got llmretry.Attempt
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) error = %v", b, err)
			}
			if diff := cmp.Diff(tc.a, got, cmp.Comparer(sameMessage), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", b, diff)
			}
		})
	}
}

// The chain itself makes the longest RetryIn: no MaxWait and a retry-after
// date in 9999. Its record, as OnAttempt sees it, decodes to itself.
func TestDoLongestWaitRecordRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		h := http.Header{}
		h.Set("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT")
		var seen []llmretry.Attempt
		c := &chain{
			Backends: []backend{{Model: "a", Call: newFake("a", always(llmretry.StatusFailure(429, h, nil))).Call, Retry: llmretry.Policy{Waits: []time.Duration{ms}, MaxWait: -1}}},
			OnAttempt: func(_ context.Context, at llmretry.Attempt) {
				seen = append(seen, at)
				cancel() // no need to wait for the year 2292
			},
		}
		c.Do(ctx, "hi")
		if len(seen) != 1 || seen[0].RetryIn != math.MaxInt64 {
			t.Fatalf("OnAttempt saw %v, want one attempt with the longest RetryIn", seen)
		}
		b, err := json.Marshal(seen[0])
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		var got llmretry.Attempt
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("json.Unmarshal(%s) error = %v", b, err)
		}
		if diff := cmp.Diff(seen[0], got, cmp.Comparer(sameMessage), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
			t.Errorf("round trip of %s (-want +got):\n%s", b, diff)
		}
	})
}

// A tiny repeated wait repeats at a second, and the summary lists only the
// first and last ten attempts; the records stay complete.
func TestDoTinyRepeatedWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		a := newFake("a", always(busy("busy")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{ms}, Reserve: -1}}}}

		_, err := c.Do(ctx, "hi")
		// 0, then 1ms, then every second while a wait ends before 120s.
		want := []time.Duration{0}
		for at := ms; at < 2*time.Minute; at += time.Second {
			want = append(want, at)
		}
		if got := a.times(); len(got) != len(want) {
			t.Fatalf("%d calls, want %d", len(got), len(want))
		}
		if diff := cmp.Diff(want, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
		attempts := exhausted(t, err)
		if len(attempts) != len(want) {
			t.Fatalf("len(Attempts) = %d, want %d: the records stay complete", len(attempts), len(want))
		}
		lines := strings.Split(err.Error(), "\n")
		wantLines := []string{lines[0]}
		for _, at := range attempts[:10] {
			wantLines = append(wantLines, "\t"+at.String())
		}
		wantLines = append(wantLines, fmt.Sprintf("\t... %d more attempts left out", len(attempts)-20))
		for _, at := range attempts[len(attempts)-10:] {
			wantLines = append(wantLines, "\t"+at.String())
		}
		if diff := cmp.Diff(wantLines, lines); diff != "" {
			t.Errorf("Error() lines (-want +got):\n%s", diff)
		}
	})
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

// A Call that ignores its context holds Do: Do waits for it, past the
// caller's cancel and past Timeout, and then reports the attempt as what
// ended it.
func TestDoWaitsForACallThatIgnoresItsContext(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name     string
		cancelAt time.Duration // 0: never
		timeout  time.Duration
		wantKind llmretry.Kind
	}{
		{name: "past_cancel", cancelAt: s, wantKind: llmretry.KindCancelled},
		{name: "past_timeout", timeout: s, wantKind: llmretry.KindTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancelAt > 0 {
					time.AfterFunc(tc.cancelAt, cancel)
				}
				deaf := func(context.Context, int) error {
					time.Sleep(10 * s) // does not watch its context
					return busy("busy")
				}
				c := &chain{Backends: []backend{{Model: "a", Call: newFake("a", deaf).Call, Timeout: tc.timeout}}}

				_, err := c.Do(ctx, "hi")
				if got := time.Since(start); got != 10*s {
					t.Errorf("Do() returned after %v, want 10s: it waits for the Call", got)
				}
				var attempts []llmretry.Attempt
				var cancelled *llmretry.Cancelled
				if errors.As(err, &cancelled) {
					attempts = cancelled.Attempts
				} else {
					attempts = exhausted(t, err)
				}
				if len(attempts) != 1 || attempts[0].Kind != tc.wantKind {
					t.Errorf("Do() records = %v, want one of kind %v", attempts, tc.wantKind)
				}
			})
		})
	}
}
