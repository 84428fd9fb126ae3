package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
)

// The chains under test take and give strings.
type (
	chain   = llmretry.Chain[string, string]
	backend = llmretry.Backend[string, string]
)

const ms = time.Millisecond

// fake is a scripted backend. Its reply decides how call n (counted from 1)
// ends: a nil error answers "<name>: <req>". It records the time of every
// call since the fake was made; inside a synctest bubble that time is exact.
type fake struct {
	name  string
	start time.Time
	reply func(ctx context.Context, n int) error

	mu    sync.Mutex
	calls []time.Duration
}

func newFake(name string, reply func(ctx context.Context, n int) error) *fake {
	return &fake{name: name, start: time.Now(), reply: reply}
}

func (f *fake) Call(ctx context.Context, req string) (string, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Since(f.start))
	n := len(f.calls)
	f.mu.Unlock()
	if err := f.reply(ctx, n); err != nil {
		return "", err
	}
	return f.name + ": " + req, nil
}

// times returns the times of the calls so far, nil when there were none.
func (f *fake) times() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return nil
	}
	return append([]time.Duration(nil), f.calls...)
}

// script fails with errs in turn, then answers.
func script(errs ...error) func(context.Context, int) error {
	return func(_ context.Context, n int) error {
		if n <= len(errs) {
			return errs[n-1]
		}
		return nil
	}
}

// always fails every call with err.
func always(err error) func(context.Context, int) error {
	return func(context.Context, int) error { return err }
}

// answers answers every call.
func answers(context.Context, int) error { return nil }

// hang blocks until the call's ctx is done and returns its error.
func hang(ctx context.Context, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}

// recorder collects what OnAttempt sees and when it sees it.
type recorder struct {
	start time.Time

	mu       sync.Mutex
	attempts []llmretry.Attempt
	at       []time.Duration
}

func newRecorder() *recorder { return &recorder{start: time.Now()} }

func (r *recorder) OnAttempt(_ context.Context, a llmretry.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, a)
	r.at = append(r.at, time.Since(r.start))
}

func (r *recorder) seen() ([]llmretry.Attempt, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]llmretry.Attempt(nil), r.attempts...), append([]time.Duration(nil), r.at...)
}

// attemptOpts compares attempts with errors matched by errors.Is.
var attemptOpts = cmp.Options{
	cmpopts.EquateErrors(),
	cmpopts.EquateEmpty(),
	cmpopts.IgnoreUnexported(llmretry.Attempt{}),
}

// ignoreTimes skips Start and Elapsed where a test does not assert them.
var ignoreTimes = cmpopts.IgnoreFields(llmretry.Attempt{}, "Start", "Elapsed")

func waits(ws ...time.Duration) llmretry.Policy { return llmretry.Policy{Waits: ws} }

func busy(msg string) *llmretry.Failure {
	return llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New(msg))
}

// exhausted returns err's attempts; it fails the test unless err is an
// *Exhausted (or a type that unwraps to one).
func exhausted(t *testing.T, err error) []llmretry.Attempt {
	t.Helper()
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) {
		t.Fatalf("Do() error = %v (%T), want an *Exhausted", err, err)
	}
	return ex.Attempts
}

// isTimedOut reports whether err is a *TimedOut.
func isTimedOut(err error) bool {
	var to *llmretry.TimedOut
	return errors.As(err, &to)
}

func TestDoRetriesThenAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		busy1, busy2 := busy("busy"), busy("still busy")
		a := newFake("a", script(busy1, busy2))
		rec := newRecorder()
		c := &chain{
			Backends:  []backend{{Model: "gpt-4o", Call: a.Call, Retry: waits(10*ms, 30*ms)}},
			OnAttempt: rec.OnAttempt,
		}

		got, err := c.Do(context.Background(), "hi")
		if got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		if diff := cmp.Diff([]time.Duration{0, 10 * ms, 40 * ms}, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
		attempts, at := rec.seen()
		want := []llmretry.Attempt{
			{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy1, Start: start, Next: llmretry.NextRetry, RetryIn: 10 * ms},
			{Backend: 0, Model: "gpt-4o", Try: 2, Kind: llmretry.KindTransient, Status: 503, Err: busy2, Start: start.Add(10 * ms), Next: llmretry.NextRetry, RetryIn: 30 * ms},
			{Backend: 0, Model: "gpt-4o", Try: 3, Start: start.Add(40 * ms)},
		}
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("OnAttempt attempts (-want +got):\n%s", diff)
		}
		// OnAttempt runs as each attempt ends, before the wait that follows it.
		if diff := cmp.Diff([]time.Duration{0, 10 * ms, 40 * ms}, at); diff != "" {
			t.Errorf("OnAttempt times (-want +got):\n%s", diff)
		}
	})
}

func TestDoZeroPolicyOneAttemptPerBackend(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
	}{
		{name: "no_deadline"},
		{name: "with_deadline", deadline: time.Hour},
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
				errA, errB := busy("a busy"), busy("b busy")
				a, b := newFake("a", always(errA)), newFake("b", always(errB))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call}, {Model: "b", Call: b.Call}}}

				_, err := c.Do(ctx, "hi")
				attempts := exhausted(t, err)
				want := []llmretry.Attempt{
					{Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: errA, Next: llmretry.NextFailOver, Why: llmretry.WhyWaitsUsed},
					{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: errB, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
				}
				if diff := cmp.Diff(want, attempts, attemptOpts, ignoreTimes); diff != "" {
					t.Errorf("attempts (-want +got):\n%s", diff)
				}
				if isTimedOut(err) {
					t.Errorf("Do() error = %T, want a plain *Exhausted", err)
				}
				if diff := cmp.Diff([]time.Duration{0}, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]time.Duration{0}, b.times()); diff != "" {
					t.Errorf("backend b calls (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestDoRetriesOnlyRetryableKinds covers contract test 3 (a 400 fails over at
// once) and the rest of the kind table.
func TestDoRetriesOnlyRetryableKinds(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantKind  llmretry.Kind
		wantCalls []time.Duration // of the first backend
	}{
		{name: "rejected_400", err: llmretry.StatusFailure(400, nil, errors.New("bad request")), wantKind: llmretry.KindRejected, wantCalls: []time.Duration{0}},
		{name: "truncated", err: llmretry.Truncation("partial"), wantKind: llmretry.KindTruncated, wantCalls: []time.Duration{0}},
		{name: "unknown", err: errors.New("mystery"), wantKind: llmretry.KindUnknown, wantCalls: []time.Duration{0}},
		{name: "transient_503", err: busy("busy"), wantKind: llmretry.KindTransient, wantCalls: []time.Duration{0, 10 * ms, 30 * ms}},
		{name: "parse", err: llmretry.ParseFailure("{", errors.New("unexpected end of JSON input")), wantKind: llmretry.KindParse, wantCalls: []time.Duration{0, 10 * ms, 30 * ms}},
		{name: "timeout", err: fmt.Errorf("read: %w", context.DeadlineExceeded), wantKind: llmretry.KindTimeout, wantCalls: []time.Duration{0, 10 * ms, 30 * ms}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				a, b := newFake("a", always(tc.err)), newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends: []backend{
						{Model: "a", Call: a.Call, Retry: waits(10*ms, 20*ms)},
						{Model: "b", Call: b.Call},
					},
					OnAttempt: rec.OnAttempt,
				}

				got, err := c.Do(context.Background(), "hi")
				if got != "b: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: hi")
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				last := tc.wantCalls[len(tc.wantCalls)-1]
				if diff := cmp.Diff([]time.Duration{last}, b.times()); diff != "" {
					t.Errorf("backend b calls (-want +got):\n%s", diff)
				}
				attempts, _ := rec.seen()
				if len(attempts) != len(tc.wantCalls)+1 {
					t.Fatalf("OnAttempt saw %d attempts, want %d", len(attempts), len(tc.wantCalls)+1)
				}
				for i, at := range attempts[:len(tc.wantCalls)] {
					if at.Kind != tc.wantKind {
						t.Errorf("attempt %d Kind = %v, want %v", i, at.Kind, tc.wantKind)
					}
				}
				if rt := attempts[len(tc.wantCalls)-1].RetryIn; rt != 0 {
					t.Errorf("last attempt of backend a RetryIn = %v, want 0", rt)
				}
			})
		})
	}
}

func TestDoWithoutDeadlineWaitsAreTheBound(t *testing.T) {
	tests := []struct {
		name        string
		waits       []time.Duration
		wantCalls   []time.Duration
		wantRetryIn []time.Duration
	}{
		{
			name:        "three_waits",
			waits:       []time.Duration{time.Second, 2 * time.Second, 3 * time.Second},
			wantCalls:   []time.Duration{0, time.Second, 3 * time.Second, 6 * time.Second},
			wantRetryIn: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 0},
		},
		{
			name:        "zero_waits",
			waits:       []time.Duration{0, 0},
			wantCalls:   []time.Duration{0, 0, 0},
			wantRetryIn: []time.Duration{0, 0, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				a := newFake("a", always(busy("busy")))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(tc.waits...)}}}

				_, err := c.Do(context.Background(), "hi")
				if got, want := time.Since(start), tc.wantCalls[len(tc.wantCalls)-1]; got != want {
					t.Errorf("Do() returned after %v, want %v", got, want)
				}
				attempts := exhausted(t, err)
				if isTimedOut(err) {
					t.Errorf("Do() error = %T, want a plain *Exhausted", err)
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("call times (-want +got):\n%s", diff)
				}
				var retryIn []time.Duration
				for _, at := range attempts {
					retryIn = append(retryIn, at.RetryIn)
				}
				if diff := cmp.Diff(tc.wantRetryIn, retryIn); diff != "" {
					t.Errorf("RetryIn of each attempt (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestDoWithDeadlineRepeatsLastWait(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name      string
		policy    llmretry.Policy
		deadline  time.Duration
		wantCalls []time.Duration
	}{
		{
			// 120s budget: after the call at 70s a 20s wait leaves exactly the
			// 30s reserve, so it is taken; after 90s it would leave 10s.
			name:      "reserve_30s",
			policy:    llmretry.Policy{Waits: []time.Duration{10 * s, 20 * s}, Reserve: 30 * s},
			deadline:  120 * s,
			wantCalls: []time.Duration{0, 10 * s, 30 * s, 50 * s, 70 * s, 90 * s},
		},
		{
			name:      "default_reserve_60s",
			policy:    llmretry.Policy{Waits: []time.Duration{10 * s}},
			deadline:  200 * s,
			wantCalls: []time.Duration{0, 10 * s, 20 * s, 30 * s, 40 * s, 50 * s, 60 * s, 70 * s, 80 * s, 90 * s, 100 * s, 110 * s, 120 * s, 130 * s, 140 * s},
		},
		{
			// A zero Reserve is at most half of what the deadline left:
			// 50s of a 100s deadline.
			name:      "default_reserve_halved",
			policy:    llmretry.Policy{Waits: []time.Duration{10 * s}},
			deadline:  100 * s,
			wantCalls: []time.Duration{0, 10 * s, 20 * s, 30 * s, 40 * s, 50 * s},
		},
		{
			// No reserve, but a wait must still end before the deadline.
			name:      "negative_reserve",
			policy:    llmretry.Policy{Waits: []time.Duration{10 * s}, Reserve: -1},
			deadline:  35 * s,
			wantCalls: []time.Duration{0, 10 * s, 20 * s, 30 * s},
		},
		{
			name:      "listed_wait_past_deadline",
			policy:    llmretry.Policy{Waits: []time.Duration{10 * s, 100 * s}, Reserve: -1},
			deadline:  60 * s,
			wantCalls: []time.Duration{0, 10 * s},
		},
		{
			name:      "first_wait_eats_reserve",
			policy:    llmretry.Policy{Waits: []time.Duration{100 * s}},
			deadline:  150 * s,
			wantCalls: []time.Duration{0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				a := newFake("a", always(busy("busy")))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy}}}

				_, err := c.Do(ctx, "hi")
				if got, want := time.Since(start), tc.wantCalls[len(tc.wantCalls)-1]; got != want {
					t.Errorf("Do() returned after %v, want %v", got, want)
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("call times (-want +got):\n%s", diff)
				}
				attempts := exhausted(t, err)
				if len(attempts) != len(tc.wantCalls) {
					t.Errorf("len(Attempts) = %d, want %d", len(attempts), len(tc.wantCalls))
				}
				// No attempt hit a deadline: the reserve ended the retries.
				if isTimedOut(err) || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Do() error = %T %v, want a plain *Exhausted", err, err)
				}
				if n := len(attempts); n > 0 && attempts[n-1].RetryIn != 0 {
					t.Errorf("last attempt RetryIn = %v, want 0", attempts[n-1].RetryIn)
				}
			})
		})
	}
}

func TestDoNestedChainOnlyOuterRetries(t *testing.T) {
	tests := []struct {
		name         string
		outer, inner llmretry.Policy
		wantCalls    []time.Duration
		wantOuter    int // attempts recorded by the outer chain
	}{
		{name: "both_retry", outer: waits(10*ms, 20*ms), inner: waits(10*ms, 20*ms), wantCalls: []time.Duration{0, 10 * ms, 30 * ms}, wantOuter: 3},
		{name: "only_inner_retries", inner: waits(10*ms, 20*ms), wantCalls: []time.Duration{0, 10 * ms, 30 * ms}, wantOuter: 1},
		{name: "only_outer_retries", outer: waits(10*ms, 20*ms), wantCalls: []time.Duration{0, 10 * ms, 30 * ms}, wantOuter: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				a := newFake("a", always(busy("busy")))
				inner := &chain{Backends: []backend{{Model: "inner", Call: a.Call, Retry: tc.inner}}}
				outer := &chain{Backends: []backend{{Model: "outer", Call: inner.Do, Retry: tc.outer}}}

				_, err := outer.Do(context.Background(), "hi")
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("calls of the real backend (-want +got):\n%s", diff)
				}
				attempts := exhausted(t, err)
				if len(attempts) != tc.wantOuter {
					t.Fatalf("outer len(Attempts) = %d, want %d", len(attempts), tc.wantOuter)
				}
				// The outer record takes Kind and Status from the inner chain's last attempt.
				for i, at := range attempts {
					if at.Kind != llmretry.KindTransient || at.Status != 503 {
						t.Errorf("outer attempt %d Kind, Status = %v, %d, want transient, 503", i, at.Kind, at.Status)
					}
					var inner *llmretry.Exhausted
					if !errors.As(at.Err, &inner) {
						t.Errorf("outer attempt %d Err = %T, want the inner *Exhausted", i, at.Err)
					}
				}
			})
		})
	}
}

// Nesting passes through a chain whose own backend has no Waits: under an
// outer attempt that may be retried, the middle chain makes one attempt
// per backend, so its attempts may be retried too (by the outer chain),
// and the innermost chain makes one attempt per backend as well.
func TestDoNestedTwoDeepOnlyOuterRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("a", always(busy("busy")))
		inner := &chain{Backends: []backend{{Model: "inner", Call: a.Call, Retry: waits(10*ms, 20*ms)}}}
		middle := &chain{Backends: []backend{{Model: "middle", Call: inner.Do}}}
		outer := &chain{Backends: []backend{{Model: "outer", Call: middle.Do, Retry: waits(10*ms, 20*ms)}}}

		_, err := outer.Do(context.Background(), "hi")
		if diff := cmp.Diff([]time.Duration{0, 10 * ms, 30 * ms}, a.times()); diff != "" {
			t.Errorf("calls of the real backend (-want +got):\n%s", diff)
		}
		if got := len(exhausted(t, err)); got != 3 {
			t.Errorf("outer len(Attempts) = %d, want 3", got)
		}
	})
}

func TestDoNestedChainAttemptRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h := http.Header{}
		h.Set("Retry-After", "2")
		limited := llmretry.StatusFailure(429, h, errors.New("slow down"))
		parse := llmretry.ParseFailure("{oops", errors.New("invalid character 'o'"))
		a := newFake("a", script(parse, limited))
		inner := &chain{Backends: []backend{{Model: "inner", Call: a.Call}}}
		rec := newRecorder()
		outer := &chain{
			Backends:  []backend{{Model: "outer", Call: inner.Do, Retry: waits(10*ms, 10*ms)}},
			OnAttempt: rec.OnAttempt,
		}

		got, err := outer.Do(context.Background(), "hi")
		if got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		// The second outer wait is max(10ms, the inner 429's retry-after of 2s).
		if diff := cmp.Diff([]time.Duration{0, 10 * ms, 10*ms + 2*time.Second}, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
		attempts, _ := rec.seen()
		want := []llmretry.Attempt{
			{Backend: 0, Model: "outer", Try: 1, Kind: llmretry.KindParse, Err: parse, RawText: ptr("{oops"), Start: start, Next: llmretry.NextRetry, RetryIn: 10 * ms},
			{Backend: 0, Model: "outer", Try: 2, Kind: llmretry.KindTransient, Status: 429, Err: limited, Start: start.Add(10 * ms), RetryAfter: 2 * time.Second, Next: llmretry.NextRetry, RetryIn: 2 * time.Second},
			{Backend: 0, Model: "outer", Try: 3, Start: start.Add(10*ms + 2*time.Second)},
		}
		// An outer record's Err is the inner chain's error as inner.Do
		// returned it; the backend's own error is a record in there, not in
		// the inner error's tree.
		for i := 0; i < 2 && i < len(attempts); i++ {
			var ex *llmretry.Exhausted
			if !errors.As(attempts[i].Err, &ex) || len(ex.Attempts) != 1 || ex.Attempts[0].Err != want[i].Err {
				t.Errorf("outer attempt %d Err = %v, want the inner *Exhausted whose record holds %v", i, attempts[i].Err, want[i].Err)
			}
			want[i].Err = attempts[i].Err
		}
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("outer attempts (-want +got):\n%s", diff)
		}
	})
}

func TestValidate(t *testing.T) {
	const model = "gpt-4o"
	answer := func(context.Context, string) (string, error) { return "answer", nil }
	// bad puts a valid backend, which must not be called either, in front of b.
	bad := func(b backend) []backend {
		b.Model, b.Call = model, answer
		return []backend{{Model: "ok", Call: answer}, b}
	}
	tests := []struct {
		name     string
		backends []backend
		wantErr  string // "" for a valid chain
	}{
		{name: "no_backends", wantErr: "llmretry: chain has no backends"},
		{name: "nil_call", backends: []backend{{Model: "ok", Call: answer}, {Model: model}}, wantErr: "llmretry: backend 1 (gpt-4o): call is nil"},
		{name: "nil_call_no_model", backends: []backend{{}}, wantErr: "llmretry: backend 0 (unknown): call is nil"},
		{name: "negative_wait", backends: bad(backend{Retry: waits(time.Second, -time.Second)}), wantErr: "llmretry: backend 1 (gpt-4o): wait 2 is negative"},
		{name: "negative_timeout", backends: bad(backend{Timeout: -time.Second}), wantErr: "llmretry: backend 1 (gpt-4o): timeout -1s is negative"},
		{name: "jitter_above_1", backends: bad(backend{Retry: llmretry.Policy{Waits: []time.Duration{time.Second}, Jitter: 1.5}}), wantErr: "llmretry: backend 1 (gpt-4o): jitter 1.5 is outside [0, 1]"},
		{name: "jitter_negative", backends: bad(backend{Retry: llmretry.Policy{Waits: []time.Duration{time.Second}, Jitter: -0.5}}), wantErr: "llmretry: backend 1 (gpt-4o): jitter -0.5 is outside [0, 1]"},
		{name: "jitter_nan", backends: bad(backend{Retry: llmretry.Policy{Waits: []time.Duration{time.Second}, Jitter: math.NaN()}}), wantErr: "llmretry: backend 1 (gpt-4o): jitter NaN is outside [0, 1]"},
		{name: "reserve_without_waits", backends: bad(backend{Retry: llmretry.Policy{Reserve: time.Minute}}), wantErr: "llmretry: backend 1 (gpt-4o): reserve is set but waits is empty"},
		{name: "max_wait_without_waits", backends: bad(backend{Retry: llmretry.Policy{MaxWait: time.Minute}}), wantErr: "llmretry: backend 1 (gpt-4o): max wait is set but waits is empty"},
		{name: "jitter_without_waits", backends: bad(backend{Retry: llmretry.Policy{Jitter: 0.5}}), wantErr: "llmretry: backend 1 (gpt-4o): jitter is set but waits is empty"},
		{name: "valid_zero_policy", backends: []backend{{Model: model, Call: answer}}},
		{name: "valid_full_policy", backends: []backend{{Model: model, Call: answer, Timeout: time.Second, Retry: llmretry.Policy{Waits: []time.Duration{0, time.Second}, Reserve: -1, MaxWait: -1, Jitter: 1}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			backends := make([]backend, len(tc.backends))
			for i, b := range tc.backends {
				if b.Call != nil {
					b.Call = func(context.Context, string) (string, error) {
						calls.Add(1)
						return "answer", nil
					}
				}
				backends[i] = b
			}
			c := &chain{Backends: backends}

			verr := c.Validate()
			_, derr := c.Do(context.Background(), "hi")
			if tc.wantErr == "" {
				if verr != nil || derr != nil {
					t.Fatalf("Validate(), Do() = %v, %v, want nil, nil", verr, derr)
				}
				return
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("Do() called a backend %d times, want 0", n)
			}
			checkConfigErr(t, "Validate()", verr, tc.wantErr)
			checkConfigErr(t, "Do()", derr, tc.wantErr)
		})
	}
}

func TestValidateNilChain(t *testing.T) {
	var c *chain
	checkConfigErr(t, "Validate()", c.Validate(), "llmretry: chain is nil")
	_, err := c.Do(context.Background(), "hi")
	checkConfigErr(t, "Do()", err, "llmretry: chain is nil")
}

func checkConfigErr(t *testing.T, call string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s = nil, want %q", call, want)
	}
	if err.Error() != want {
		t.Errorf("%s = %q, want %q", call, err.Error(), want)
	}
	if !errors.Is(err, llmretry.ErrConfig) {
		t.Errorf("errors.Is(%s, ErrConfig) = false, want true", call)
	}
	if llmretry.RetryItem(err) {
		t.Errorf("RetryItem(%s) = true, want false", call)
	}
	// The error itself declares the advice, not something it wraps.
	if ir, ok := err.(llmretry.ItemRetryable); !ok || ir.ItemRetryable() {
		t.Errorf("%s = %T, want a type declaring ItemRetryable() == false", call, err)
	}
	var ex *llmretry.Exhausted
	var ca *llmretry.Cancelled
	if errors.As(err, &ex) || errors.As(err, &ca) {
		t.Errorf("%s = %T, want a configuration error, not a chain error", call, err)
	}
}

func TestDoRetryAfter(t *testing.T) {
	header := func(kv ...string) func() http.Header {
		return func() http.Header {
			h := http.Header{}
			for i := 0; i < len(kv); i += 2 {
				h.Set(kv[i], kv[i+1])
			}
			return h
		}
	}
	tests := []struct {
		name     string
		header   func() http.Header // made at the time of the call
		policy   llmretry.Policy
		deadline time.Duration // 0: none
		wantA    []time.Duration
		wantB    []time.Duration
	}{
		{name: "seconds", header: header("Retry-After", "1"), policy: waits(10 * ms), wantA: []time.Duration{0, time.Second}},
		{name: "milliseconds", header: header("Retry-After-Ms", "250"), policy: waits(10 * ms), wantA: []time.Duration{0, 250 * ms}},
		{name: "shorter_than_wait", header: header("Retry-After-Ms", "5"), policy: waits(10 * ms), wantA: []time.Duration{0, 10 * ms}},
		{
			name: "http_date",
			header: func() http.Header {
				h := http.Header{}
				h.Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
				return h
			},
			policy: waits(10 * ms),
			wantA:  []time.Duration{0, 3 * time.Second},
		},
		{
			// 120s - 90s leaves 30s, less than the default 60s reserve.
			name:     "beyond_deadline_budget",
			header:   header("Retry-After", "90"),
			policy:   waits(10 * ms),
			deadline: 2 * time.Minute,
			wantA:    []time.Duration{0},
			wantB:    []time.Duration{0},
		},
		{
			name:     "beyond_deadline_no_reserve",
			header:   header("Retry-After", "20"),
			policy:   llmretry.Policy{Waits: []time.Duration{10 * ms}, Reserve: -1},
			deadline: 10 * time.Second,
			wantA:    []time.Duration{0},
			wantB:    []time.Duration{0},
		},
		{name: "beyond_default_max_wait", header: header("Retry-After", "301"), policy: waits(10 * ms), wantA: []time.Duration{0}, wantB: []time.Duration{0}},
		{name: "beyond_max_wait", header: header("Retry-After", "3"), policy: llmretry.Policy{Waits: []time.Duration{10 * ms}, MaxWait: 2 * time.Second}, wantA: []time.Duration{0}, wantB: []time.Duration{0}},
		{name: "no_max_wait", header: header("Retry-After", "3600"), policy: llmretry.Policy{Waits: []time.Duration{10 * ms}, MaxWait: -1}, wantA: []time.Duration{0, time.Hour}},
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
				a := newFake("a", func(_ context.Context, n int) error {
					if n == 1 {
						return llmretry.StatusFailure(429, tc.header(), errors.New("rate limited"))
					}
					return nil
				})
				b := newFake("b", answers)
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy}, {Model: "b", Call: b.Call}}}

				got, err := c.Do(ctx, "hi")
				want := "a: hi"
				if tc.wantB != nil {
					want = "b: hi"
				}
				if got != want || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, want)
				}
				if diff := cmp.Diff(tc.wantA, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantB, b.times()); diff != "" {
					t.Errorf("backend b calls (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestDoFailureRetryAfterField(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := &llmretry.Failure{Kind: llmretry.KindTransient, RetryAfter: 2 * time.Second}
		a := newFake("a", script(slow))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10 * ms)}}}

		got, err := c.Do(context.Background(), "hi")
		if got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		if diff := cmp.Diff([]time.Duration{0, 2 * time.Second}, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
	})
}

func TestDoCancelled(t *testing.T) {
	cause := errors.New("user left")
	tests := []struct {
		name         string
		reply        func(context.Context, int) error
		policy       llmretry.Policy
		classify     func(error) llmretry.Kind
		cancelAt     time.Duration // < 0: before Do
		wantCalls    []time.Duration
		wantAttempts []llmretry.Attempt
	}{
		{
			name:     "before_first_call",
			reply:    answers,
			cancelAt: -1,
		},
		{
			name:      "during_wait",
			reply:     always(busy("busy")),
			policy:    waits(time.Second),
			cancelAt:  500 * ms,
			wantCalls: []time.Duration{0},
			wantAttempts: []llmretry.Attempt{
				// OnAttempt saw a retry in 1s; the record says the wait was cut short.
				{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy("busy"), Next: llmretry.NextStop, Why: llmretry.WhyCancelled},
			},
		},
		{
			name:      "mid_call",
			reply:     hang,
			policy:    waits(time.Second),
			cancelAt:  200 * ms,
			wantCalls: []time.Duration{0},
			wantAttempts: []llmretry.Attempt{
				{Model: "a", Try: 1, Kind: llmretry.KindCancelled, Err: context.Canceled, Elapsed: 200 * ms, Next: llmretry.NextStop, Why: llmretry.WhyCancelled},
			},
		},
		{
			// Whatever the backend returns and whatever Classify says, the
			// caller's cancel decides the Kind.
			name: "mid_call_backend_blames_server",
			reply: func(ctx context.Context, _ int) error {
				<-ctx.Done()
				return busy("busy")
			},
			classify:  func(error) llmretry.Kind { return llmretry.KindTransient },
			policy:    waits(time.Second),
			cancelAt:  200 * ms,
			wantCalls: []time.Duration{0},
			wantAttempts: []llmretry.Attempt{
				{Model: "a", Try: 1, Kind: llmretry.KindCancelled, Status: 503, Err: busy("busy"), Elapsed: 200 * ms, Next: llmretry.NextStop, Why: llmretry.WhyCancelled},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				if tc.cancelAt < 0 {
					cancel(cause)
				} else {
					time.AfterFunc(tc.cancelAt, func() { cancel(cause) })
				}
				a, b := newFake("a", tc.reply), newFake("b", answers)
				c := &chain{
					Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy}, {Model: "b", Call: b.Call}},
					Classify: tc.classify,
				}

				_, err := c.Do(ctx, "hi")
				if got, want := time.Since(start), max(tc.cancelAt, 0); got != want {
					t.Errorf("Do() returned after %v, want %v", got, want)
				}
				var ca *llmretry.Cancelled
				if !errors.As(err, &ca) {
					t.Fatalf("Do() error = %v (%T), want a *Cancelled", err, err)
				}
				if ca.Cause != cause {
					t.Errorf("Cancelled.Cause = %v, want %v", ca.Cause, cause)
				}
				// The Cause is a field to read, not part of the tree.
				if !errors.Is(err, context.Canceled) || errors.Is(err, cause) {
					t.Errorf("errors.Is(err, context.Canceled), errors.Is(err, cause) = %t, %t, want true, false",
						errors.Is(err, context.Canceled), errors.Is(err, cause))
				}
				var ex *llmretry.Exhausted
				if errors.As(err, &ex) {
					t.Errorf("errors.As(err, *Exhausted) = true, want false for a *Cancelled")
				}
				// Errors are matched by message here: busy("busy") is a new value.
				opts := cmp.Options{
					cmpopts.IgnoreFields(llmretry.Attempt{}, "Start"),
					cmpopts.EquateEmpty(),
					cmpopts.IgnoreUnexported(llmretry.Attempt{}),
					cmp.Comparer(sameMessage),
				}
				if diff := cmp.Diff(tc.wantAttempts, ca.Attempts, opts); diff != "" {
					t.Errorf("Cancelled.Attempts (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				if got := b.times(); got != nil {
					t.Errorf("backend b calls = %v, want none", got)
				}
			})
		})
	}
}

// sameMessage reports whether two errors are both nil or have the same text.
func sameMessage(x, y error) bool {
	if x == nil || y == nil {
		return x == nil && y == nil
	}
	return x.Error() == y.Error()
}

func TestDoAttemptCancelledEndsChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		closed := fmt.Errorf("stream closed: %w", context.Canceled)
		a, b := newFake("a", always(closed)), newFake("b", answers)
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(time.Second)}, {Model: "b", Call: b.Call}}}

		_, err := c.Do(context.Background(), "hi")
		var ca *llmretry.Cancelled
		if !errors.As(err, &ca) {
			t.Fatalf("Do() error = %v (%T), want a *Cancelled", err, err)
		}
		if ca.Cause != closed {
			t.Errorf("Cancelled.Cause = %v, want %v", ca.Cause, closed)
		}
		want := []llmretry.Attempt{{Model: "a", Try: 1, Kind: llmretry.KindCancelled, Err: closed, Next: llmretry.NextStop, Why: llmretry.WhyCancelled}}
		if diff := cmp.Diff(want, ca.Attempts, attemptOpts, ignoreTimes); diff != "" {
			t.Errorf("Cancelled.Attempts (-want +got):\n%s", diff)
		}
		if got := a.times(); len(got) != 1 {
			t.Errorf("backend a calls = %v, want 1", got)
		}
		if got := b.times(); got != nil {
			t.Errorf("backend b calls = %v, want none", got)
		}
	})
}

func TestDoNestedCancelledEndsOuterChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		closed := fmt.Errorf("stream closed: %w", context.Canceled)
		a, b := newFake("a", always(closed)), newFake("b", answers)
		inner := &chain{Backends: []backend{{Model: "inner", Call: a.Call}}}
		outer := &chain{Backends: []backend{{Model: "outer", Call: inner.Do, Retry: waits(10 * ms)}, {Model: "b", Call: b.Call}}}

		_, err := outer.Do(context.Background(), "hi")
		var ca *llmretry.Cancelled
		if !errors.As(err, &ca) {
			t.Fatalf("Do() error = %v (%T), want a *Cancelled", err, err)
		}
		if len(ca.Attempts) != 1 || ca.Attempts[0].Kind != llmretry.KindCancelled {
			t.Errorf("outer Cancelled.Attempts = %v, want one attempt of kind cancelled", ca.Attempts)
		}
		// The Cause is the inner chain's *Cancelled, whose own Cause is the
		// backend's error.
		var innerErr *llmretry.Cancelled
		if !errors.As(ca.Cause, &innerErr) || innerErr.Cause != closed {
			t.Errorf("Cancelled.Cause = %v, want the inner chain's *Cancelled caused by %v", ca.Cause, closed)
		}
		if got := b.times(); got != nil {
			t.Errorf("backend b calls = %v, want none", got)
		}
	})
}

func TestDoContextAlreadyDone(t *testing.T) {
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		wantErr func(error) bool
	}{
		{
			name: "deadline_passed",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			},
			wantErr: func(err error) bool { return isTimedOut(err) && errors.Is(err, context.DeadlineExceeded) },
		},
		{
			name: "cancelled",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			wantErr: func(err error) bool {
				var ca *llmretry.Cancelled
				return errors.As(err, &ca) && errors.Is(err, context.Canceled)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := tc.ctx()
				defer cancel()
				a := newFake("a", answers)
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(ms)}}}

				got, err := c.Do(ctx, "hi")
				if got != "" || !tc.wantErr(err) {
					t.Fatalf("Do() = %q, %v (%T), want \"\" and the typed error", got, err, err)
				}
				if calls := a.times(); calls != nil {
					t.Errorf("backend calls = %v, want none", calls)
				}
				if !strings.HasPrefix(err.Error(), "llmretry: ") {
					t.Errorf("Do() error = %q, want prefix %q", err, "llmretry: ")
				}
			})
		})
	}
}

func TestDoCallerDeadlineEndsChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a, b := newFake("a", hang), newFake("b", answers)
		c := &chain{
			Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10 * ms)}, {Model: "b", Call: b.Call}},
			// The caller's deadline decides the Kind, not Classify.
			Classify: func(error) llmretry.Kind { return llmretry.KindRejected },
		}

		_, err := c.Do(ctx, "hi")
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("Do() returned after %v, want 5s", got)
		}
		if !isTimedOut(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do() error = %v (%T), want a *TimedOut matching context.DeadlineExceeded", err, err)
		}
		want := []llmretry.Attempt{{Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: context.DeadlineExceeded, Start: start, Elapsed: 5 * time.Second, Next: llmretry.NextStop, Why: llmretry.WhyDeadline}}
		if diff := cmp.Diff(want, exhausted(t, err), attemptOpts); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
		if got := b.times(); got != nil {
			t.Errorf("backend b calls = %v, want none once the deadline passed", got)
		}
	})
}

func TestDoStreaming(t *testing.T) {
	tests := []struct {
		name      string
		reply     func(context.Context, int) error
		want      string // "" when Do fails
		wantA     []time.Duration
		wantB     []time.Duration
		wantFirst llmretry.Attempt // the first attempt, as OnAttempt saw it
	}{
		{
			name: "delivered_then_failed",
			reply: func(ctx context.Context, _ int) error {
				llmretry.Delivered(ctx)
				return busy("stream broke")
			},
			wantA:     []time.Duration{0},
			wantFirst: llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy("stream broke"), Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true},
		},
		{
			name: "failed_before_delivered",
			reply: func(ctx context.Context, n int) error {
				if n == 1 {
					return busy("busy")
				}
				llmretry.Delivered(ctx)
				return nil
			},
			want:      "a: hi",
			wantA:     []time.Duration{0, 10 * ms},
			wantFirst: llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy("busy"), Next: llmretry.NextRetry, RetryIn: 10 * ms},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				a, b := newFake("a", tc.reply), newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: a.Call, Retry: waits(10*ms, 10*ms)}, {Model: "b", Call: b.Call}},
					OnAttempt: rec.OnAttempt,
				}

				got, err := c.Do(context.Background(), "hi")
				if tc.want != "" {
					if got != tc.want || err != nil {
						t.Fatalf("Do() = %q, %v, want %q, nil", got, err, tc.want)
					}
				} else {
					attempts := exhausted(t, err)
					if len(attempts) != 1 || !attempts[0].Delivered {
						t.Errorf("Attempts = %v, want one attempt with Delivered true", attempts)
					}
				}
				if diff := cmp.Diff(tc.wantA, a.times()); diff != "" {
					t.Errorf("backend a calls (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantB, b.times()); diff != "" {
					t.Errorf("backend b calls (-want +got):\n%s", diff)
				}
				seen, _ := rec.seen()
				if len(seen) == 0 {
					t.Fatal("OnAttempt saw no attempts")
				}
				opts := cmp.Options{ignoreTimes, cmpopts.IgnoreUnexported(llmretry.Attempt{}), cmp.Comparer(sameMessage)}
				if diff := cmp.Diff(tc.wantFirst, seen[0], opts); diff != "" {
					t.Errorf("first attempt (-want +got):\n%s", diff)
				}
				if tc.want != "" && !seen[len(seen)-1].Delivered {
					t.Errorf("successful attempt Delivered = false, want true")
				}
			})
		})
	}
}

func TestDeliveredOutsideAnAttemptIsNoOp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		llmretry.Delivered(ctx)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		llmretry.Delivered(ctx)

		a := newFake("a", script(busy("busy"), busy("busy")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10*ms, 10*ms)}}}
		got, err := c.Do(ctx, "hi")
		if got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		if diff := cmp.Diff([]time.Duration{0, 10 * ms, 20 * ms}, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
	})
}

func TestDoStreamingNested(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newFake("a", func(ctx context.Context, _ int) error {
			llmretry.Delivered(ctx)
			return busy("stream broke")
		})
		b := newFake("b", answers)
		inner := &chain{Backends: []backend{{Model: "inner", Call: a.Call, Retry: waits(10 * ms)}}}
		outer := &chain{Backends: []backend{
			{Model: "outer", Call: inner.Do, Retry: waits(10*ms, 10*ms)},
			{Model: "b", Call: b.Call},
		}}

		_, err := outer.Do(context.Background(), "hi")
		attempts := exhausted(t, err)
		if len(attempts) != 1 || !attempts[0].Delivered {
			t.Errorf("outer Attempts = %v, want one attempt with Delivered true", attempts)
		}
		if got := a.times(); len(got) != 1 {
			t.Errorf("inner backend calls = %v, want 1", got)
		}
		if got := b.times(); got != nil {
			t.Errorf("outer backend b calls = %v, want none", got)
		}
	})
}

func TestDoPerAttemptTimeout(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name      string
		reply     func(context.Context, int) error
		wantCalls []time.Duration
		wantErr   bool
	}{
		{
			name: "hang_then_answer",
			reply: func(ctx context.Context, n int) error {
				if n == 1 {
					return hang(ctx, n)
				}
				return nil
			},
			wantCalls: []time.Duration{0, 1100 * ms},
		},
		{
			// The timer ended the call, so it is a timeout whatever the
			// backend says.
			name: "hang_then_blame_request",
			reply: func(ctx context.Context, n int) error {
				if n == 1 {
					<-ctx.Done()
					return llmretry.StatusFailure(400, nil, errors.New("bad request"))
				}
				return nil
			},
			wantCalls: []time.Duration{0, 1100 * ms},
		},
		{
			name:      "always_hangs",
			reply:     hang,
			wantCalls: []time.Duration{0, 1100 * ms, 2200 * ms},
			wantErr:   true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				a := newFake("a", tc.reply)
				rec := newRecorder()
				c := &chain{
					Backends:  []backend{{Model: "a", Call: a.Call, Timeout: s, Retry: waits(100*ms, 100*ms)}},
					OnAttempt: rec.OnAttempt,
				}

				got, err := c.Do(context.Background(), "hi")
				if diff := cmp.Diff(tc.wantCalls, a.times()); diff != "" {
					t.Errorf("call times (-want +got):\n%s", diff)
				}
				seen, _ := rec.seen()
				if len(seen) != len(tc.wantCalls) {
					t.Fatalf("OnAttempt saw %d attempts, want %d", len(seen), len(tc.wantCalls))
				}
				first := seen[0]
				if first.Kind != llmretry.KindTimeout || first.Elapsed != s || !first.Start.Equal(start) {
					t.Errorf("first attempt Kind, Elapsed, Start = %v, %v, %v, want timeout, 1s, %v", first.Kind, first.Elapsed, first.Start, start)
				}
				if !tc.wantErr {
					if got != "a: hi" || err != nil {
						t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
					}
					return
				}
				if d := time.Since(start); d != 3200*ms {
					t.Errorf("Do() returned after %v, want 3.2s", d)
				}
				if !isTimedOut(err) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Do() error = %v (%T), want a *TimedOut matching context.DeadlineExceeded", err, err)
				}
				attempts := exhausted(t, err)
				want := []llmretry.Attempt{
					{Model: "a", Try: 1, Kind: llmretry.KindTimeout, Err: context.DeadlineExceeded, Start: start, Elapsed: s, Next: llmretry.NextRetry, RetryIn: 100 * ms},
					{Model: "a", Try: 2, Kind: llmretry.KindTimeout, Err: context.DeadlineExceeded, Start: start.Add(1100 * ms), Elapsed: s, Next: llmretry.NextRetry, RetryIn: 100 * ms},
					{Model: "a", Try: 3, Kind: llmretry.KindTimeout, Err: context.DeadlineExceeded, Start: start.Add(2200 * ms), Elapsed: s, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
				}
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("attempts (-want +got):\n%s", diff)
				}
				if !llmretry.RetryItem(err) {
					t.Errorf("RetryItem(*TimedOut) = false, want true")
				}
			})
		})
	}
}

func TestDoTruncationFailsOverAndWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cut := llmretry.Truncation("partial answer")
		empty := &llmretry.Failure{Kind: llmretry.KindParse, RawText: ptr(""), Err: errors.New("empty body")}
		wrapped := fmt.Errorf("provider: %w", llmretry.StatusFailure(500, nil, errors.New("upstream on fire")))
		a := newFake("a", always(cut))
		b := newFake("b", always(empty))
		d := newFake("d", always(wrapped))
		c := &chain{Backends: []backend{
			{Model: "a", Call: a.Call, Retry: waits(10 * ms)},
			{Call: b.Call},
			{Model: "d", Call: d.Call},
		}}

		_, err := c.Do(context.Background(), "hi")
		var tr *llmretry.Truncated
		if !errors.As(err, &tr) {
			t.Fatalf("Do() error = %v (%T), want a *Truncated", err, err)
		}
		if llmretry.RetryItem(err) {
			t.Errorf("RetryItem(*Truncated) = true, want false")
		}
		want := []llmretry.Attempt{
			{Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTruncated, Err: cut, RawText: ptr("partial answer"), Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
			{Backend: 1, Model: "unknown", Try: 1, Kind: llmretry.KindParse, Err: empty, RawText: ptr(""), Next: llmretry.NextFailOver, Why: llmretry.WhyWaitsUsed},
			{Backend: 2, Model: "d", Try: 1, Kind: llmretry.KindTransient, Status: 500, Err: wrapped, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
		}
		if diff := cmp.Diff(want, tr.Attempts, attemptOpts, ignoreTimes); diff != "" {
			t.Errorf("attempts (-want +got):\n%s", diff)
		}
		// RawText "" is present, not absent.
		if len(tr.Attempts) > 1 && tr.Attempts[1].RawText == nil {
			t.Errorf("attempt 1 RawText = nil, want a pointer to \"\"")
		}
	})
}

func TestDoCustomClassify(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		classify  func(error) llmretry.Kind
		wantCalls int
	}{
		{name: "503_as_rejected", err: busy("busy"), classify: func(error) llmretry.Kind { return llmretry.KindRejected }, wantCalls: 1},
		{name: "unknown_as_transient", err: errors.New("odd"), classify: func(error) llmretry.Kind { return llmretry.KindTransient }, wantCalls: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				a := newFake("a", always(tc.err))
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(ms, ms)}}, Classify: tc.classify}

				_, err := c.Do(context.Background(), "hi")
				exhausted(t, err)
				if got := len(a.times()); got != tc.wantCalls {
					t.Errorf("backend calls = %d, want %d", got, tc.wantCalls)
				}
			})
		})
	}
}

func TestDoJitter(t *testing.T) {
	tests := []struct {
		name   string
		jitter float64
		lo, hi time.Duration
	}{
		{name: "half", jitter: 0.5, lo: 50 * ms, hi: 100 * ms},
		{name: "full", jitter: 1, lo: 0, hi: 100 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				seen := map[time.Duration]bool{}
				for range 50 {
					a := newFake("a", script(busy("busy")))
					c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{100 * ms}, Jitter: tc.jitter}}}}
					if _, err := c.Do(context.Background(), "hi"); err != nil {
						t.Fatalf("Do() error = %v, want nil", err)
					}
					calls := a.times()
					if len(calls) != 2 {
						t.Fatalf("calls = %v, want 2", calls)
					}
					w := calls[1]
					if w < tc.lo || w > tc.hi {
						t.Errorf("wait = %v, want in [%v, %v]", w, tc.lo, tc.hi)
					}
					seen[w] = true
				}
				if len(seen) < 2 {
					t.Errorf("50 jittered waits took %d distinct values, want several", len(seen))
				}
			})
		})
	}
}

// TestDoConcurrent shares one Chain among 100 goroutines; run it with -race.
func TestDoConcurrent(t *testing.T) {
	t.Parallel()
	type logKey struct{}
	var aCalls, bCalls, seen atomic.Int64
	c := &llmretry.Chain[int, string]{
		Backends: []llmretry.Backend[int, string]{
			{
				Model: "a",
				Retry: llmretry.Policy{Waits: []time.Duration{0}},
				Call: func(_ context.Context, n int) (string, error) {
					aCalls.Add(1)
					if n%2 == 0 {
						return "", busy("busy")
					}
					return "a" + strconv.Itoa(n), nil
				},
			},
			{
				Model: "b",
				Call: func(_ context.Context, n int) (string, error) {
					bCalls.Add(1)
					return "b" + strconv.Itoa(n), nil
				},
			},
		},
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
			seen.Add(1)
			log := ctx.Value(logKey{}).(*[]llmretry.Attempt)
			*log = append(*log, a)
		},
	}

	const n = 100
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			var log []llmretry.Attempt
			ctx := context.WithValue(context.Background(), logKey{}, &log)
			<-begin
			got, err := c.Do(ctx, i)
			want, wantTries := "a"+strconv.Itoa(i), []string{"0/1"}
			if i%2 == 0 {
				want, wantTries = "b"+strconv.Itoa(i), []string{"0/1", "0/2", "1/1"}
			}
			if got != want || err != nil {
				t.Errorf("Do(%d) = %q, %v, want %q, nil", i, got, err, want)
			}
			var tries []string
			for _, a := range log {
				tries = append(tries, fmt.Sprintf("%d/%d", a.Backend, a.Try))
			}
			if diff := cmp.Diff(wantTries, tries); diff != "" {
				t.Errorf("Do(%d) attempts backend/try (-want +got):\n%s", i, diff)
			}
		})
	}
	close(begin)
	wg.Wait()

	if got, want := aCalls.Load(), int64(n/2*2+n/2); got != want {
		t.Errorf("backend a calls = %d, want %d", got, want)
	}
	if got, want := bCalls.Load(), int64(n/2); got != want {
		t.Errorf("backend b calls = %d, want %d", got, want)
	}
	if got, want := seen.Load(), int64(n/2*3+n/2); got != want {
		t.Errorf("OnAttempt calls = %d, want %d", got, want)
	}
}

func TestDoSuccessAllocations(t *testing.T) {
	c := &chain{Backends: []backend{{
		Model: "a",
		Retry: waits(time.Second),
		Call:  func(_ context.Context, req string) (string, error) { return req, nil },
	}}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := c.Do(ctx, "hi"); err != nil {
			t.Fatalf("Do() error = %v, want nil", err)
		}
	})
	if allocs > 1 {
		t.Errorf("Do() made %v allocations on the success path, want at most 1", allocs)
	}
}

func ptr(s string) *string { return &s }

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

// A backend that returns a nil *Failure (a typed nil) does not panic the
// chain: the attempt is unknown and fails over.
func TestDoTypedNilFailure(t *testing.T) {
	var nilFailure *llmretry.Failure
	c := &chain{Backends: []backend{
		{Model: "a", Call: func(context.Context, string) (string, error) { return "", nilFailure }, Retry: waits(0)},
		{Model: "b", Call: newFake("b", answers).Call},
	}}
	got, err := c.Do(context.Background(), "hi")
	if err != nil || got != "b: hi" {
		t.Errorf("Do() = %q, %v, want %q, nil", got, err, "b: hi")
	}
	if k := llmretry.Classify(nilFailure); k != llmretry.KindUnknown {
		t.Errorf("Classify(nil *Failure) = %v, want %v", k, llmretry.KindUnknown)
	}
	if msg := nilFailure.Error(); !strings.HasPrefix(msg, "llmretry: ") {
		t.Errorf("(*Failure)(nil).Error() = %q, want a llmretry: message", msg)
	}
}

// A panicking Call with a per-attempt Timeout leaves no timer running: the
// panic reaches the caller, and the attempt's context has been cancelled
// rather than left waiting for its timer.
func TestDoPanickingCallStopsItsTimer(t *testing.T) {
	var attemptCtx context.Context
	c := &chain{Backends: []backend{{
		Model:   "a",
		Timeout: time.Hour,
		Call: func(ctx context.Context, _ string) (string, error) {
			attemptCtx = ctx
			panic("backend bug")
		},
	}}}
	defer func() {
		if r := recover(); r != "backend bug" {
			t.Errorf("recover() = %v, want the backend's panic", r)
		}
		if err := attemptCtx.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("attempt ctx.Err() = %v after the panic, want %v", err, context.Canceled)
		}
	}()
	c.Do(context.Background(), "hi")
	t.Fatal("Do() returned, want the backend's panic")
}

// A record keeps at most MaxRawText bytes of a model's output (64 KiB by
// default), cut at a character boundary and marked; the backend's Failure
// keeps it whole.
func TestDoCapsRawText(t *testing.T) {
	huge := strings.Repeat("é", 1<<20) // two bytes a character: 2 MiB
	tests := []struct {
		name     string
		max      int
		wantLen  int // bytes kept before the mark; -1: all
		wantMark string
	}{
		{name: "default", max: 0, wantLen: 64 << 10, wantMark: " [llmretry: 2031616 bytes cut]"},
		{name: "odd_limit_keeps_whole_characters", max: 5, wantLen: 4, wantMark: " [llmretry: 2097148 bytes cut]"},
		{name: "no_limit", max: -1, wantLen: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := llmretry.ParseFailure(huge, errors.New("not JSON"))
			c := &chain{
				Backends:   []backend{{Model: "a", Call: func(context.Context, string) (string, error) { return "", f }}},
				MaxRawText: tc.max,
			}
			_, err := c.Do(context.Background(), "hi")
			attempts := exhausted(t, err)
			raw := *attempts[0].RawText
			if tc.wantLen < 0 {
				if raw != huge {
					t.Errorf("RawText has %d bytes, want all %d", len(raw), len(huge))
				}
				return
			}
			kept, mark := raw[:tc.wantLen], raw[tc.wantLen:]
			if kept != huge[:tc.wantLen] || mark != tc.wantMark {
				t.Errorf("RawText = %d bytes then %q, want %d bytes then %q", len(kept), mark, tc.wantLen, tc.wantMark)
			}
			if !utf8.ValidString(raw) {
				t.Errorf("RawText is not valid UTF-8: a character was split")
			}
			if *f.RawText != huge {
				t.Errorf("the backend's Failure.RawText was changed")
			}
		})
	}
}
