package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

// tripFor opens br with a retry-after hint of d, as a provider that says
// when it will be back does: one failed request, no cap on the hint.
func tripFor(t *testing.T, br *llmretry.Breaker, d time.Duration) {
	t.Helper()
	fail := func(context.Context, string) (string, error) { return "", hintFailure(d) }
	// A one-second deadline turns the hint's retry down: only the breaker
	// keeps it.
	c := &chain{Backends: []backend{{Model: "tripper", Call: fail, Retry: llmretry.Policy{Waits: []time.Duration{0}, MaxWait: -1}, Breaker: br}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Do(ctx, "trip")
	if st := br.State(); !st.Open || time.Until(st.Until).Round(time.Microsecond) != d {
		t.Fatalf("tripFor: breaker State() = %+v, want it open for %v", st, d)
	}
}

// hintFailure is a 503 with a retry-after hint of d.
func hintFailure(d time.Duration) *llmretry.Failure {
	return &llmretry.Failure{Kind: llmretry.KindTransient, Status: http.StatusServiceUnavailable, RetryAfter: d}
}

// waitRec is the record of a call that waited d, from at, for a breaker
// opened by kind, retryAfter before it half-opened, and then sent try
// number try.
func waitRec(bi int, model string, try int, kind llmretry.Kind, at time.Time, retryAfter, d time.Duration) llmretry.Attempt {
	return llmretry.Attempt{
		Backend: bi, Model: model, Try: try, Kind: kind, Start: at,
		RetryAfter: retryAfter, Next: llmretry.NextRetry, RetryIn: d, Skipped: true,
	}
}

// A new user's batch, in one call: the primary hard down behind a
// Breaker that failures opened, the fallback truncating. The truncated call comes back
// to the primary, but waits for it no longer than its waits would have
// kept it on the primary, counted from when it first came to it (the
// skip): with Waits 200ms and 500ms, never the 30s cooldown. The
// rule holds at its edge: a cooldown that ends within them is waited for.
func TestBreakerWaitBoundedByUnusedWaits(t *testing.T) {
	trunc := llmretry.Truncation("partial")
	tests := []struct {
		name     string
		waits    []time.Duration
		deadline time.Duration // 0: none
		maxTries int
		waitsFor bool // the come-back waits for the primary's breaker
	}{
		{name: "short_waits", waits: []time.Duration{200 * ms, 500 * ms}},
		{name: "short_waits_deadline_capped", waits: []time.Duration{200 * ms, 500 * ms}, deadline: 5 * time.Minute, maxTries: 3},
		{name: "no_waits", waits: nil},
		// The breaker half-opens at 30s, 29s after the call first came
		// to the primary, skipping it at 1s (the come-back is at 2s).
		{name: "waits_cover_it", waits: []time.Duration{20 * sec, 9 * sec}, waitsFor: true},
		{name: "waits_one_short", waits: []time.Duration{20 * sec, 9*sec - 1}},
		// Under a deadline a positive last wait repeats, but for a
		// breaker it counts once without MaxTries: 200ms.
		{name: "repeating_last_wait", waits: []time.Duration{200 * ms}, deadline: 5 * time.Minute},
		// With MaxTries high enough, the repeats cover the 29s: 200ms
		// and 30 repeats of 1s.
		{name: "repeats_cover_it", waits: []time.Duration{200 * ms}, deadline: 5 * time.Minute, maxTries: 32, waitsFor: true},
		// Capped by MaxTries: 200ms then 1s repeats twice more, 2.2s.
		{name: "repeats_capped", waits: []time.Duration{200 * ms}, deadline: 5 * time.Minute, maxTries: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				br := &llmretry.Breaker{}
				trip(t, br, busy("down")) // open until 30s, by failures
				time.Sleep(sec)
				a := newDesk("a", takes(0))
				b := newDesk("b", takes(sec, trunc))
				rec := newRecorder()
				c := &chain{Backends: []backend{
					{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: tc.waits, MaxTries: tc.maxTries}, Breaker: br},
					{Model: "b", Call: b.Call},
				}, OnAttempt: rec.OnAttempt}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				got, err := c.Do(ctx, "hi")
				returned := time.Since(start)
				attempts, _ := rec.seen()
				want := []llmretry.Attempt{
					skipRec(0, "a", 1, llmretry.KindTransient, start.Add(sec), 29*sec, llmretry.NextFailOver, llmretry.WhyBreaker),
					{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: start.Add(sec), Elapsed: sec, Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
				}
				if tc.waitsFor {
					if got != "a: hi" || err != nil {
						t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
					}
					want = append(want,
						waitRec(0, "a", 1, llmretry.KindTransient, start.Add(2*sec), 28*sec, 28*sec),
						okRec(0, "a", 1, start.Add(30*sec), 0))
					if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
						t.Errorf("records (-want +got):\n%s", diff)
					}
					return
				}
				var tr *llmretry.Truncated
				if !errors.As(err, &tr) {
					t.Fatalf("Do() = %q, %v, want a *Truncated", got, err)
				}
				if returned != 2*sec {
					t.Errorf("Do() returned at %v, want 2s: when b truncated, not when a's breaker half-opened", returned)
				}
				want = append(want, skipRec(0, "a", 1, llmretry.KindTransient, start.Add(2*sec), 28*sec, llmretry.NextStop, llmretry.WhyBreaker))
				if diff := cmp.Diff(want, tr.Attempts, attemptOpts); diff != "" {
					t.Errorf("error's records (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("OnAttempt records (-want +got):\n%s", diff)
				}
				if a.log() != nil {
					t.Errorf("requests to a = %v, want none", a.log())
				}
			})
		})
	}
}

// The same, but a retry-after hint opened the primary's breaker. The provider said when it would be back, so the
// truncated call waits it out, and its record says so.
func TestBreakerHintedWaitedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		trunc := llmretry.Truncation("partial")
		br := &llmretry.Breaker{}
		tripFor(t, br, 30*sec)
		time.Sleep(sec)
		a := newDesk("a", takes(0))
		b := newDesk("b", takes(sec, trunc))
		rec := newRecorder()
		c := &chain{Backends: []backend{
			{Model: "a", Call: a.Call, Retry: waits(200*ms, 500*ms), Breaker: br},
			{Model: "b", Call: b.Call},
		}, OnAttempt: rec.OnAttempt}
		if got, err := c.Do(context.Background(), "hi"); got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		want := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, start.Add(sec), 29*sec, llmretry.NextFailOver, llmretry.WhyBreaker),
			{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: start.Add(sec), Elapsed: sec, Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
			waitRec(0, "a", 1, llmretry.KindTransient, start.Add(2*sec), 28*sec, 28*sec),
			okRec(0, "a", 1, start.Add(30*sec), 0),
		}
		attempts, _ := rec.seen()
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{29 * sec, "hi"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
	})
}

// A retry whose wait ends while the last backend's breaker is still open
// waits for the breaker too, within its unused waits, and the records say
// both waits: the retry's, and the breaker's, with its length.
func TestBreakerStretchedRetryRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		down := busy("down")
		// Opens after one failure, for 10s.
		br := &llmretry.Breaker{Failures: 1, Cooldown: 10 * sec}
		a := newDesk("a", takes(0, down))
		rec := newRecorder()
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(20*ms, 20*sec), Breaker: br}}, OnAttempt: rec.OnAttempt}
		if got, err := c.Do(context.Background(), "hi"); got != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
		}
		at := start.Add(20 * ms)
		want := []llmretry.Attempt{
			{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: down, Start: start, Next: llmretry.NextRetry, RetryIn: 20 * ms},
			waitRec(0, "a", 2, llmretry.KindTransient, at, 10*sec-20*ms, 10*sec-20*ms),
			okRec(0, "a", 2, start.Add(10*sec), 0),
		}
		attempts, _ := rec.seen()
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		if got, want := attempts[1].String(), "[backend 0 a try 2] skipped: breaker open after transient failures (retrying in 9.98s)"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
}

// MaxTries caps one backend's requests in a call, the repeating last wait
// under a deadline included, with Why waits_used; then the call fails over.
func TestMaxTries(t *testing.T) {
	tests := []struct {
		name     string
		maxTries int
		deadline time.Duration
		wantReqs int
	}{
		{name: "caps_repeats", maxTries: 3, deadline: 30 * sec, wantReqs: 3},
		{name: "one", maxTries: 1, deadline: 30 * sec, wantReqs: 1},
		{name: "caps_list", maxTries: 2, wantReqs: 2},
		{name: "list_bounds_first", maxTries: 9, wantReqs: 3}, // no deadline: two waits, three tries
		{name: "no_cap", deadline: 30 * sec, wantReqs: 17},    // 0, 50ms, 100ms, then every 1s until 14.1s: the 15s reserve
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				down := busy("down")
				a := newDesk("a", func(int) (time.Duration, error) { return 0, down })
				b := newDesk("b", takes(0))
				rec := newRecorder()
				c := &chain{Backends: []backend{
					{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{50 * ms, 50 * ms}, MaxTries: tc.maxTries}},
					{Model: "b", Call: b.Call},
				}, OnAttempt: rec.OnAttempt}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				if got, err := c.Do(ctx, "hi"); got != "b: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: hi")
				}
				if got := len(a.log()); got != tc.wantReqs {
					t.Errorf("requests to a = %d, want %d", got, tc.wantReqs)
				}
				attempts, _ := rec.seen()
				last := attempts[len(attempts)-2]
				if last.Next != llmretry.NextFailOver || (tc.maxTries > 0 && last.Why != llmretry.WhyWaitsUsed) {
					t.Errorf("a's last record = %v, want failing over: waits_used", last)
				}
			})
		})
	}
}

func TestMaxTriesValidate(t *testing.T) {
	call := func(context.Context, string) (string, error) { return "", nil }
	tests := []struct {
		name   string
		policy llmretry.Policy
		want   string // "" for valid
	}{
		{name: "negative", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxTries: -1}, want: "llmretry: backend 0 (a): max tries -1 is negative"},
		{name: "without_waits", policy: llmretry.Policy{MaxTries: 2}, want: "llmretry: backend 0 (a): max tries is set but waits is empty"},
		{name: "set", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxTries: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &chain{Backends: []backend{{Model: "a", Call: call, Retry: tc.policy}}}
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, llmretry.ErrConfig)):
				t.Errorf("Validate() = %v, want %q wrapping ErrConfig", err, tc.want)
			}
		})
	}
}

// Calls waiting for a breaker that closes go in line order, a millisecond
// apart, so the outcome does not depend on which goroutine runs first: a
// backend that answers only the first request of each instant (as a
// rate-limited one decides in arrival order) gives the same records on
// every run, however the calls' goroutines are started.
func TestBreakerHandOffDeterministic(t *testing.T) {
	const calls = 12
	play := func() [][]string {
		var out [][]string
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			br := &llmretry.Breaker{}
			tripFor(t, br, 5*sec)
			var mu sync.Mutex
			var lastAt time.Time
			first := func(context.Context, string) (string, error) {
				mu.Lock()
				now := time.Now()
				fresh := !now.Equal(lastAt)
				lastAt = now
				mu.Unlock()
				time.Sleep(500 * ms)
				if !fresh {
					return "", limited(1)
				}
				return "ok", nil
			}
			recs := make([]*recorder, calls)
			outs := make([]<-chan outcome, calls)
			for _, i := range rand.Perm(calls) {
				recs[i] = newRecorder()
				c := &chain{Backends: []backend{{Model: "a", Call: first, Retry: waits(sec), Breaker: br}}, OnAttempt: recs[i].OnAttempt}
				outs[i] = doAt(context.Background(), c, time.Duration(i+1)*100*ms, fmt.Sprint(i))
			}
			out = make([][]string, calls)
			for i := range calls {
				<-outs[i]
				attempts, _ := recs[i].seen()
				for _, a := range attempts {
					out[i] = append(out[i], fmt.Sprintf("%v at %v", a, a.Start.Sub(start)))
				}
			}
		})
		return out
	}
	want := play()
	for run := 1; run < 5; run++ {
		if diff := cmp.Diff(want, play()); diff != "" {
			t.Fatalf("run %d: records differ from run 0 (-run 0 +run %d):\n%s", run, run, diff)
		}
	}
}

// A caller that withdraws while OnAttempt hears of its wait for the
// breaker sends nothing: the error's record of the wait says stop,
// cancelled, and the probe it was let through for goes to the next call.
func TestBreakerCancelledDuringWaitRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		tripFor(t, br, 10*sec)
		a := newDesk("a", takes(0))
		ctx, cancel := context.WithCancel(context.Background())
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}, OnAttempt: func(context.Context, llmretry.Attempt) { cancel() }}
		_, err := c.Do(ctx, "waiter")
		var cn *llmretry.Cancelled
		if !errors.As(err, &cn) {
			t.Fatalf("Do() error = %v, want a *Cancelled", err)
		}
		want := []llmretry.Attempt{{Model: "a", Try: 1, Kind: llmretry.KindTransient, Start: start, RetryAfter: 10 * sec, Skipped: true, Next: llmretry.NextStop, Why: llmretry.WhyCancelled}}
		if diff := cmp.Diff(want, cn.Attempts, attemptOpts); diff != "" {
			t.Errorf("error's records (-want +got):\n%s", diff)
		}
		other := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		if got, err := other.Do(context.Background(), "next"); got != "a: next" || err != nil {
			t.Errorf("next Do() = %q, %v, want %q, nil: the probe passed on", got, err, "a: next")
		}
		if diff := cmp.Diff([]sent{{10 * sec, "next"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
	})
}

// A call asleep in the wait before its retry is in the breaker's line,
// but holds no one up until the wait ends: a call that comes to the
// half-open breaker meanwhile gets the probe instead of skipping.
func TestRetryWaitHoldsNoOneUpAtHalfOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{Failures: 100}
		// A's 503 at 0; B's 429 at 0, open until 1s; then answers.
		a := newDesk("a", takes(0, busy("down"), limited(1)))
		b := newDesk("b", takes(0))
		retrying := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(8 * sec), Breaker: br}}}
		once := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		both := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}

		callA := doAt(context.Background(), retrying, 0, "A") // asleep until 8s
		synctest.Wait()
		if _, err := once.Do(context.Background(), "B"); err == nil {
			t.Fatalf("call B: Do() = nil error, want its 429")
		}
		want := llmretry.BreakerState{Open: true, Until: start.Add(sec), Failures: 2, Kind: llmretry.KindTransient, Opened: 1}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() after B's 429 (-want +got):\n%s", diff)
		}

		time.Sleep(3 * sec)
		if resp, err := both.Do(context.Background(), "C"); resp != "a: C" || err != nil {
			t.Errorf("call C at 3s: Do() = %q, %v, want %q, nil: it is the probe", resp, err, "a: C")
		}
		if o := <-callA; o.resp != "a: A" || o.err != nil || o.at.Sub(start) != 8*sec {
			t.Errorf("call A: Do() = %q, %v at %v, want %q, nil at 8s", o.resp, o.err, o.at.Sub(start), "a: A")
		}
		if diff := cmp.Diff([]sent{{0, "A"}, {0, "B"}, {3 * sec, "C"}, {8 * sec, "A"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
		if got := b.log(); got != nil {
			t.Errorf("requests to b = %v, want none", got)
		}
	})
}

// When the breaker will still be open when the retry's wait ends, the
// retry would only skip: the call fails over at once, at the attempt's
// end, and comes back to the backend when the later one fails for a
// reason about the request.
func TestFailOverAtOnceWhenBreakerOutlastsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		down := busy("down")
		trunc := llmretry.Truncation("partial")
		br := &llmretry.Breaker{Failures: 1, Cooldown: 10 * sec}
		a := newDesk("a", takes(sec, down)) // fails at 1s: open until 11s
		b := newDesk("b", takes(sec, trunc))
		rec := newRecorder()
		c := &chain{
			Backends: []backend{
				// The second wait, 10s, lets the come-back wait for the
				// breaker: a call waits no longer than its unused waits.
				{Model: "a", Call: a.Call, Retry: waits(sec, 10*sec), Breaker: br},
				{Model: "b", Call: b.Call},
			},
			OnAttempt: rec.OnAttempt,
		}
		if resp, err := c.Do(context.Background(), "hi"); resp != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", resp, err, "a: hi")
		}
		want := []llmretry.Attempt{
			{Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: down, Start: start, Elapsed: sec, Next: llmretry.NextFailOver, Why: llmretry.WhyBreaker},
			{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: start.Add(sec), Elapsed: sec, Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
			waitRec(0, "a", 2, llmretry.KindTransient, start.Add(2*sec), 9*sec, 9*sec),
			okRec(0, "a", 2, start.Add(11*sec), sec), // a's retry, put off until its breaker half-opened
		}
		attempts, at := rec.seen()
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]time.Duration{sec, 2 * sec, 11 * sec, 12 * sec}, at); diff != "" {
			t.Errorf("OnAttempt times (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{0, "hi"}, {11 * sec, "hi"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{sec, "hi"}}, b.log()); diff != "" {
			t.Errorf("requests to b (-want +got):\n%s", diff)
		}
	})
}

// A wait for a breaker that ends at the caller's deadline (no reserve) may
// wake a moment before the context's own timer fires. The error is a
// *TimedOut either way, and it must still match the cause the caller gave
// its deadline, whichever timer ran first.
func TestBreakerWaitToTheDeadlineKeepsTheCause(t *testing.T) {
	budget := errors.New("request budget spent")
	lost := 0
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			br := &llmretry.Breaker{Failures: 1, Cooldown: sec}
			trip(t, br, busy("down"))
			time.Sleep(2 * sec) // half-open
			release := make(chan struct{})
			hang := func(ctx context.Context, _ string) (string, error) {
				<-release
				return "", busy("down")
			}
			probe := &chain{Backends: []backend{{Model: "a", Call: hang, Breaker: br}}}
			go probe.Do(context.Background(), "probe")
			synctest.Wait() // the probe is in flight
			c := &chain{Backends: []backend{{Model: "a", Call: hang, Breaker: br,
				Retry: llmretry.Policy{Waits: []time.Duration{time.Hour}, Reserve: -1}}}}
			ctx, cancel := context.WithTimeoutCause(context.Background(), 10*sec, budget)
			defer cancel()
			_, err := c.Do(ctx, "waiter")
			var to *llmretry.TimedOut
			if !errors.As(err, &to) {
				t.Fatalf("Do() = %v (%T), want a *TimedOut", err, err)
			}
			if !errors.Is(err, budget) {
				lost++
			}
			close(release)
		})
	}
	if lost > 0 {
		t.Errorf("Do() lost the deadline's cause in %d of 50 runs, want none", lost)
	}
}

// OnAttempt hears of a wait for a breaker that ended with the call let
// through as the half-open probe before the probe is sent. A panic there
// must not leave the breaker half-open with no probe in flight: every
// later call would skip the backend for good.
func TestBreakerPanickingOnAttemptReleasesTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		tripFor(t, br, 30*sec)
		a := newDesk("a", takes(0))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}},
			OnAttempt: func(ctx context.Context, at llmretry.Attempt) {
				if at.Skipped && at.Next == llmretry.NextRetry {
					panic("hook bug")
				}
			}}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("Do() did not panic, want the hook's panic")
				}
			}()
			c.Do(context.Background(), "waiter")
		}()
		if st := br.State(); st.Probing {
			t.Fatalf("State() after the hook panicked = %+v, want no probe in flight", st)
		}
		after := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		if got, err := after.Do(context.Background(), "next"); err != nil {
			t.Errorf("Do() after the panic = %q, %v, want the next call to probe and be answered", got, err)
		}
	})
}

// A call that waited for a breaker in vain records the wait (Start when
// it began, Elapsed its length), and its advice counts from the end of
// the wait: RetryItemAfter is the time until the breaker half-opens, and
// shrinks as time passes, however long the wait was.
func TestBreakerWaitInVainAdvice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{Failures: 1, Cooldown: 10 * sec}
		trip(t, br, busy("down")) // open until 10s
		slow := newDesk("a", takes(5*sec, busy("down")))
		policy := llmretry.Policy{Waits: []time.Duration{20 * sec}}
		first := &chain{Backends: []backend{{Model: "a", Call: slow.Call, Breaker: br, Retry: policy}}}
		firstDone := doAt(context.Background(), first, 0, "first") // first in line: probes at 10s, fails at 15s
		time.Sleep(time.Millisecond)
		c := &chain{Backends: []backend{{Model: "a", Call: slow.Call, Breaker: br, Retry: policy}}}
		_, err := c.Do(context.Background(), "second")
		// Reopened at 15s until 25s: past the 20s its waits allow.
		if got, want := time.Since(start), 15*sec; got != want {
			t.Fatalf("Do() returned at %v, want %v", got, want)
		}
		recs := exhausted(t, err)
		last := recs[len(recs)-1]
		want := skipRec(0, "a", 1, llmretry.KindTransient, start.Add(time.Millisecond), 10*sec, llmretry.NextStop, llmretry.WhyBreaker)
		want.Elapsed = 15*sec - time.Millisecond
		if diff := cmp.Diff(want, last, attemptOpts); diff != "" {
			t.Errorf("last record (-want +got):\n%s", diff)
		}
		if d, ok := llmretry.RetryItemAfter(err); !ok || d != 10*sec {
			t.Errorf("RetryItemAfter() at 15s = %v, %v, want 10s, true", d, ok)
		}
		time.Sleep(5 * sec)
		if d, ok := llmretry.RetryItemAfter(err); !ok || d != 5*sec {
			t.Errorf("RetryItemAfter() at 20s = %v, %v, want 5s, true", d, ok)
		}
		<-firstDone
	})
}
