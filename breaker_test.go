package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// The tests in this file hold the Breaker to its rules, in virtual time:
// every time and every record is exact.

const sec = time.Second

// desk is a scripted backend that logs who sent each request and when, so
// that a test can say which call got a probe. Request n (counted from 1)
// takes the latency reply gives it and then fails with its error, or
// answers "<name>: <req>"; a call whose context ends first gets the
// context's error, as an HTTP client would.
type desk struct {
	name  string
	start time.Time
	reply func(n int) (time.Duration, error)

	mu   sync.Mutex
	reqs []sent
}

// sent is one request a desk received: when, counted from the desk's
// making, and the request, which names the call that sent it.
type sent struct {
	At  time.Duration
	Req string
}

func newDesk(name string, reply func(n int) (time.Duration, error)) *desk {
	return &desk{name: name, start: time.Now(), reply: reply}
}

func (d *desk) Call(ctx context.Context, req string) (string, error) {
	d.mu.Lock()
	// To the microsecond: a Breaker with a Store lets the calls of an
	// instant ask together, a nanosecond on.
	d.reqs = append(d.reqs, sent{time.Since(d.start).Round(time.Microsecond), req})
	n := len(d.reqs)
	d.mu.Unlock()
	lat, err := d.reply(n)
	if lat > 0 {
		t := time.NewTimer(lat)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
	if err != nil {
		return "", err
	}
	return d.name + ": " + req, nil
}

// log returns the requests so far, nil when there were none.
func (d *desk) log() []sent {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reqs) == 0 {
		return nil
	}
	return append([]sent(nil), d.reqs...)
}

// takes answers each request after lat, failing the first ones with errs
// in turn.
func takes(lat time.Duration, errs ...error) func(int) (time.Duration, error) {
	return func(n int) (time.Duration, error) {
		if n <= len(errs) {
			return lat, errs[n-1]
		}
		return lat, nil
	}
}

// limited is a 429 whose Retry-After header says secs seconds.
func limited(secs int) *llmretry.Failure {
	h := http.Header{}
	h.Set("Retry-After", strconv.Itoa(secs))
	return llmretry.StatusFailure(http.StatusTooManyRequests, h, errors.New("rate limited"))
}

// errTimedOut classifies as KindTimeout without taking any time.
var errTimedOut = fmt.Errorf("read: %w", context.DeadlineExceeded)

// trip opens br now, as other callers' failures with err would, through a
// chain of its own that the tests' desks do not see.
func trip(t *testing.T, br *llmretry.Breaker, err error) {
	t.Helper()
	fail := func(context.Context, string) (string, error) { return "", err }
	c := &chain{Backends: []backend{{Model: "tripper", Call: fail, Breaker: br}}}
	n := br.Failures
	if n == 0 {
		n = llmretry.DefaultBreakerFailures
	}
	for range n {
		c.Do(context.Background(), "trip")
	}
	if !br.State().Open {
		t.Fatalf("trip: breaker State() = %+v, want it open", br.State())
	}
}

// skipRec is the record of a try that a breaker opened by kind skipped at
// at, retryAfter before it half-opens.
func skipRec(bi int, model string, try int, kind llmretry.Kind, at time.Time, retryAfter time.Duration, next llmretry.Next, why llmretry.Why) llmretry.Attempt {
	return llmretry.Attempt{
		Backend: bi, Model: model, Try: try, Kind: kind, Start: at,
		RetryAfter: retryAfter, Next: next, Why: why, Skipped: true,
	}
}

// okRec is the record of a success.
func okRec(bi int, model string, try int, at time.Time, elapsed time.Duration) llmretry.Attempt {
	return llmretry.Attempt{Backend: bi, Model: model, Try: try, Start: at, Elapsed: elapsed}
}

// doAt runs c.Do for req in its own goroutine once d of virtual time has
// passed since the call, and returns a channel that delivers the outcome.
func doAt(ctx context.Context, c *chain, d time.Duration, req string) <-chan outcome {
	out := make(chan outcome, 1)
	go func() {
		time.Sleep(d)
		resp, err := c.Do(ctx, req)
		out <- outcome{resp, err, time.Now()}
	}()
	return out
}

// outcome is what a Do returned, and when.
type outcome struct {
	resp string
	err  error
	at   time.Time
}

func TestBreakerClosedPassesCalls(t *testing.T) {
	tests := []struct {
		name string
		br   *llmretry.Breaker
	}{
		{name: "no_breaker"},
		{name: "zero_breaker", br: &llmretry.Breaker{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				busy1 := busy("busy")
				a := newFake("a", script(busy1))
				rec := newRecorder()
				var states []llmretry.BreakerState
				c := &chain{
					Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(sec), Breaker: tc.br}},
					OnAttempt: func(ctx context.Context, at llmretry.Attempt) {
						rec.OnAttempt(ctx, at)
						if tc.br != nil {
							states = append(states, tc.br.State())
						}
					},
				}
				got, err := c.Do(context.Background(), "hi")
				if got != "a: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
				}
				// Exactly what a chain without a breaker does.
				want := []llmretry.Attempt{
					{Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: busy1, Start: start, Next: llmretry.NextRetry, RetryIn: sec},
					okRec(0, "a", 2, start.Add(sec), 0),
				}
				attempts, _ := rec.seen()
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("OnAttempt attempts (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]time.Duration{0, sec}, a.times()); diff != "" {
					t.Errorf("calls (-want +got):\n%s", diff)
				}
				if tc.br == nil {
					return
				}
				// One failure counted, then the success reset the count.
				wantStates := []llmretry.BreakerState{{Failures: 1}, {}}
				if diff := cmp.Diff(wantStates, states); diff != "" {
					t.Errorf("State() after each attempt (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// Consecutive transient or timeout failures, one per Do call, open the
// breaker after Failures of them; the next call skips the backend without
// sending and fails over, its record saying so.
func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	const hour = time.Hour // a desk latency that the backend's Timeout cuts short
	tests := []struct {
		name     string
		br       *llmretry.Breaker
		replies  []error // one per call; nil: a hang that the 2s Timeout ends
		wantKind llmretry.Kind
		cooldown time.Duration
	}{
		{name: "default_five_transient", br: &llmretry.Breaker{}, replies: []error{busy("1"), busy("2"), busy("3"), busy("4"), busy("5")}, wantKind: llmretry.KindTransient, cooldown: 30 * sec},
		{name: "custom_two", br: &llmretry.Breaker{Failures: 2, Cooldown: 7 * sec}, replies: []error{busy("1"), busy("2")}, wantKind: llmretry.KindTransient, cooldown: 7 * sec},
		{name: "one", br: &llmretry.Breaker{Failures: 1}, replies: []error{busy("1")}, wantKind: llmretry.KindTransient, cooldown: 30 * sec},
		{name: "timeouts", br: &llmretry.Breaker{Failures: 3}, replies: []error{nil, nil, nil}, wantKind: llmretry.KindTimeout, cooldown: 30 * sec},
		{name: "mixed_kinds", br: &llmretry.Breaker{Failures: 4}, replies: []error{busy("1"), nil, errTimedOut, busy("4")}, wantKind: llmretry.KindTransient, cooldown: 30 * sec},
		{name: "opened_by_a_timeout", br: &llmretry.Breaker{Failures: 2}, replies: []error{busy("1"), nil}, wantKind: llmretry.KindTimeout, cooldown: 30 * sec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				a := newDesk("a", func(n int) (time.Duration, error) {
					if n > len(tc.replies) {
						return 0, nil
					}
					if tc.replies[n-1] == nil {
						return hour, nil
					}
					return 0, tc.replies[n-1]
				})
				b := newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends: []backend{
						{Model: "a", Call: a.Call, Timeout: 2 * sec, Breaker: tc.br},
						{Model: "b", Call: b.Call},
					},
					OnAttempt: rec.OnAttempt,
				}
				var lastEnd time.Time
				for i := range tc.replies {
					if st := tc.br.State(); st != (llmretry.BreakerState{Failures: i}) {
						t.Fatalf("before call %d: State() = %+v, want closed with %d failures", i+1, st, i)
					}
					if got, err := c.Do(context.Background(), "hi"); got != "b: hi" || err != nil {
						t.Fatalf("call %d: Do() = %q, %v, want %q, nil", i+1, got, err, "b: hi")
					}
					attempts, _ := rec.seen()
					lastEnd = attempts[len(attempts)-2].Start.Add(attempts[len(attempts)-2].Elapsed)
					time.Sleep(sec)
				}
				n := len(tc.replies)
				want := llmretry.BreakerState{Open: true, Until: lastEnd.Add(tc.cooldown), Failures: n, Kind: tc.wantKind, Opened: 1}
				if diff := cmp.Diff(want, tc.br.State()); diff != "" {
					t.Fatalf("State() after %d failures (-want +got):\n%s", n, diff)
				}

				// Open: the next call skips a without sending anything.
				now := time.Now()
				before, _ := rec.seen()
				if got, err := c.Do(context.Background(), "hi"); got != "b: hi" || err != nil {
					t.Fatalf("Do() while open = %q, %v, want %q, nil", got, err, "b: hi")
				}
				if got := len(a.log()); got != n {
					t.Errorf("a received %d requests, want %d: none while open", got, n)
				}
				attempts, _ := rec.seen()
				wantRecs := []llmretry.Attempt{
					skipRec(0, "a", 1, tc.wantKind, now, lastEnd.Add(tc.cooldown).Sub(now), llmretry.NextFailOver, llmretry.WhyBreaker),
					okRec(1, "b", 1, now, 0),
				}
				if diff := cmp.Diff(wantRecs, attempts[len(before):], attemptOpts); diff != "" {
					t.Errorf("records of the call while open (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// Failures of the other Kinds are about the request, not the backend's
// health: they neither count towards opening the breaker nor clear the
// count.
func TestBreakerOtherKindsDoNotCount(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{name: "rejected", err: llmretry.StatusFailure(400, nil, errors.New("bad request"))},
		{name: "truncated", err: llmretry.Truncation("partial")},
		{name: "parse", err: llmretry.ParseFailure("{", errors.New("unexpected end of JSON input"))},
		{name: "unknown", err: errors.New("mystery")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				// One counted failure would open it.
				br := &llmretry.Breaker{Failures: 1}
				a := newFake("a", always(tc.err))
				b := newFake("b", answers)
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
				for i := range 5 {
					if got, err := c.Do(context.Background(), "hi"); got != "b: hi" || err != nil {
						t.Fatalf("call %d: Do() = %q, %v, want %q, nil", i+1, got, err, "b: hi")
					}
				}
				if st := br.State(); st != (llmretry.BreakerState{}) {
					t.Errorf("State() after 5 %s failures = %+v, want closed with no failures", tc.name, st)
				}
				if got := len(a.times()); got != 5 {
					t.Errorf("a received %d requests, want 5", got)
				}
			})
		})
		t.Run(tc.name+"_between_transients", func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				br := &llmretry.Breaker{Failures: 2}
				a := newFake("a", script(busy("1"), tc.err, busy("3")))
				b := newFake("b", answers)
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
				var states []llmretry.BreakerState
				for range 3 {
					c.Do(context.Background(), "hi")
					states = append(states, br.State())
				}
				want := []llmretry.BreakerState{
					{Failures: 1},
					{Failures: 1},
					{Open: true, Until: time.Now().Add(30 * sec), Failures: 2, Kind: llmretry.KindTransient, Opened: 1},
				}
				if diff := cmp.Diff(want, states); diff != "" {
					t.Errorf("State() after each call (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestBreakerSuccessResetsCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{Failures: 3}
		a := newFake("a", func(_ context.Context, n int) error {
			if n == 3 {
				return nil
			}
			return busy("busy")
		})
		b := newFake("b", answers)
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
		var got []llmretry.BreakerState
		for range 6 {
			c.Do(context.Background(), "hi")
			got = append(got, br.State())
		}
		want := []llmretry.BreakerState{
			{Failures: 1}, {Failures: 2}, {}, {Failures: 1}, {Failures: 2},
			{Open: true, Until: time.Now().Add(30 * sec), Failures: 3, Kind: llmretry.KindTransient, Opened: 1},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("State() after each call (-want +got):\n%s", diff)
		}
	})
}

// One retry-after hint opens the breaker at once, whatever the count, for
// every caller that shares it, until the hint runs out.
func TestBreakerRetryAfterOpensForEveryCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{} // five failures would be needed without the hint
		hint := limited(20)
		a1 := newDesk("a", takes(0, hint))
		b := newFake("b", answers)
		rec1 := newRecorder()
		c1 := &chain{Backends: []backend{{Model: "a", Call: a1.Call, Breaker: br}, {Model: "b", Call: b.Call}}, OnAttempt: rec1.OnAttempt}
		if got, err := c1.Do(context.Background(), "one"); got != "b: one" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "b: one")
		}
		want := llmretry.BreakerState{Open: true, Until: start.Add(20 * sec), Failures: 1, Kind: llmretry.KindTransient, Opened: 1}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Fatalf("State() after the hint (-want +got):\n%s", diff)
		}

		// Another chain holding the same breaker, for the same deployment.
		a2 := newDesk("a", takes(0))
		cc := newFake("c", answers)
		rec2 := newRecorder()
		c2 := &chain{Backends: []backend{{Model: "a", Call: a2.Call, Breaker: br}, {Model: "c", Call: cc.Call}}, OnAttempt: rec2.OnAttempt}
		time.Sleep(5 * sec)
		if got, err := c2.Do(context.Background(), "two"); got != "c: two" || err != nil {
			t.Fatalf("Do() at 5s = %q, %v, want %q, nil", got, err, "c: two")
		}
		time.Sleep(15 * sec) // the hint has run out
		if got, err := c2.Do(context.Background(), "three"); got != "a: three" || err != nil {
			t.Fatalf("Do() at 20s = %q, %v, want %q, nil", got, err, "a: three")
		}
		if diff := cmp.Diff([]sent{{20 * sec, "three"}}, a2.log()); diff != "" {
			t.Errorf("requests to a from the second chain (-want +got):\n%s", diff)
		}
		attempts, _ := rec2.seen()
		wantRecs := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, start.Add(5*sec), 15*sec, llmretry.NextFailOver, llmretry.WhyBreaker),
			okRec(1, "c", 1, start.Add(5*sec), 0),
			okRec(0, "a", 1, start.Add(20*sec), 0),
		}
		if diff := cmp.Diff(wantRecs, attempts, attemptOpts); diff != "" {
			t.Errorf("second chain's records (-want +got):\n%s", diff)
		}
		if st := br.State(); st != (llmretry.BreakerState{Opened: 1}) {
			t.Errorf("State() after the probe answered = %+v, want closed", st)
		}
	})
}

// A hint holds the breaker open no longer than the reporting backend's
// MaxWait: a longer one is a broken server's.
func TestBreakerRetryAfterCappedByMaxWait(t *testing.T) {
	tests := []struct {
		name      string
		policy    llmretry.Policy
		hintSecs  int
		wantUntil time.Duration
		wantNext  llmretry.Next
		wantWhy   llmretry.Why
		wantIn    time.Duration
	}{
		{name: "max_wait", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 10 * sec}, hintSecs: 60, wantUntil: 10 * sec, wantNext: llmretry.NextFailOver, wantWhy: llmretry.WhyMaxWait},
		{name: "default_max_wait", policy: waits(sec), hintSecs: 600, wantUntil: llmretry.DefaultMaxWait, wantNext: llmretry.NextFailOver, wantWhy: llmretry.WhyMaxWait},
		{name: "no_cap", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: -1}, hintSecs: 3600, wantUntil: time.Hour, wantNext: llmretry.NextRetry, wantIn: time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				br := &llmretry.Breaker{}
				hint := limited(tc.hintSecs)
				a := newDesk("a", takes(0, hint))
				b := newFake("b", answers)
				var first *llmretry.Attempt
				var state llmretry.BreakerState
				c := &chain{
					Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy, Breaker: br}, {Model: "b", Call: b.Call}},
					OnAttempt: func(_ context.Context, at llmretry.Attempt) {
						if first == nil {
							first, state = &at, br.State()
						}
					},
				}
				c.Do(context.Background(), "hi")
				want := llmretry.Attempt{
					Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: hint, Start: start,
					RetryAfter: time.Duration(tc.hintSecs) * sec, Next: tc.wantNext, Why: tc.wantWhy, RetryIn: tc.wantIn,
				}
				if diff := cmp.Diff(want, *first, attemptOpts); diff != "" {
					t.Errorf("record of the hinted attempt (-want +got):\n%s", diff)
				}
				wantState := llmretry.BreakerState{Open: true, Until: start.Add(tc.wantUntil), Failures: 1, Kind: llmretry.KindTransient, Opened: 1}
				if diff := cmp.Diff(wantState, state); diff != "" {
					t.Errorf("State() after the hint (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A skip encodes as a dead-letter table reads it: "skipped": true, fail_over,
// breaker, the Kind that opened it, no status and zero elapsed.
func TestBreakerSkipRecordRenders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := &llmretry.Breaker{}
		trip(t, br, busy("down"))
		time.Sleep(10 * sec)
		a := newFake("a", answers)
		b := newFake("b", answers)
		rec := newRecorder()
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}, OnAttempt: rec.OnAttempt}
		c.Do(context.Background(), "hi")
		attempts, _ := rec.seen()
		skip := attempts[0]
		var got map[string]any
		if err := json.Unmarshal([]byte(mustJSON(t, skip)), &got); err != nil {
			t.Fatal(err)
		}
		delete(got, "start")
		want := map[string]any{
			"backend": 0.0, "model": "a", "try": 1.0, "kind": "transient", "status": 0.0,
			"elapsed_ms": 0.0, "retry_after_ms": 20000.0, "next": "fail_over", "why": "breaker",
			"retry_in_ms": 0.0, "delivered": false, "skipped": true,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("skip record JSON (-want +got):\n%s", diff)
		}
		if got, want := skip.String(), "[backend 0 a try 1] skipped: breaker open after transient failures (failing over: breaker)"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
}

// When the open backend is the last the call can try, the call waits for
// it to half-open while the wait passes the checks a retry-after hint
// passes, MaxWait and the deadline less the reserve, and stops with why
// "breaker" otherwise.
func TestBreakerLastBackendWaitsForHalfOpen(t *testing.T) {
	tests := []struct {
		name     string
		cooldown time.Duration
		policy   llmretry.Policy
		deadline time.Duration // from the call, at 10s; 0: none
		waits    bool
	}{
		{name: "no_deadline", waits: true},
		{name: "deadline_fits", deadline: 100 * sec, waits: true}, // reserves 50s: 20s leaves 80s
		{name: "deadline_past_default_reserve", deadline: 30 * sec},
		{name: "reserve_exactly", policy: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: 10 * sec}, deadline: 30 * sec, waits: true},
		{name: "reserve_short", policy: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: 10 * sec}, deadline: 30*sec - 1},
		{name: "no_reserve_before_deadline", policy: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: -1}, deadline: 20*sec + 1, waits: true},
		{name: "no_reserve_at_deadline", policy: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: -1}, deadline: 20 * sec},
		{name: "max_wait_exactly", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 20 * sec}, waits: true},
		{name: "max_wait_short", policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 20*sec - 1}},
		{name: "default_max_wait", cooldown: 10 * time.Minute},
		{name: "no_max_wait", cooldown: 10 * time.Minute, policy: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: -1}, waits: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				cooldown := 30 * sec
				if tc.cooldown > 0 {
					cooldown = tc.cooldown
				}
				// Opened by a retry-after hint, which a waiting call may
				// wait out within MaxWait and the reserve (the bound of its
				// unused waits is breaker_wait_test.go's).
				br := &llmretry.Breaker{}
				tripFor(t, br, cooldown)
				a := newDesk("a", takes(0))
				time.Sleep(10 * sec)
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				rec := newRecorder()
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy, Breaker: br}}, OnAttempt: rec.OnAttempt}

				got, err := c.Do(ctx, "hi")
				attempts, _ := rec.seen()
				if tc.waits {
					if got != "a: hi" || err != nil {
						t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
					}
					if diff := cmp.Diff([]sent{{cooldown, "hi"}}, a.log()); diff != "" {
						t.Errorf("requests to a (-want +got):\n%s", diff)
					}
					want := []llmretry.Attempt{
						waitRec(0, "a", 1, llmretry.KindTransient, start.Add(10*sec), cooldown-10*sec, cooldown-10*sec),
						okRec(0, "a", 1, start.Add(cooldown), 0),
					}
					if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
						t.Errorf("records (-want +got):\n%s", diff)
					}
					return
				}
				if got, want := time.Since(start), 10*sec; got != want {
					t.Errorf("Do() returned at %v, want %v: at once", got, want)
				}
				want := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, start.Add(10*sec), cooldown-10*sec, llmretry.NextStop, llmretry.WhyBreaker)}
				if diff := cmp.Diff(want, exhausted(t, err), attemptOpts); diff != "" {
					t.Errorf("error's records (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("OnAttempt records (-want +got):\n%s", diff)
				}
				if isTimedOut(err) {
					t.Errorf("Do() error = %T, want a plain *Exhausted: no deadline ran out", err)
				}
				if a.log() != nil {
					t.Errorf("a received %v, want nothing", a.log())
				}
			})
		})
	}
}

// The last backend's breaker is half-open with a probe in flight: the call
// waits for the probe to end while its deadline less the reserve allows.
func TestBreakerLastBackendWaitsForProbe(t *testing.T) {
	tests := []struct {
		name     string
		probe    error // how the probe, sent at 30s, ends at 40s
		policy   llmretry.Policy
		deadline time.Duration // of the waiting call, sent at 31s; 0: none
		wantReqs []sent
		stopAt   time.Duration // when the waiting call stops; 0: it is answered
	}{
		{name: "probe_answers", wantReqs: []sent{{30 * sec, "probe"}, {40 * sec, "waiter"}}},
		{name: "probe_fails", probe: hintFailure(30 * sec), wantReqs: []sent{{30 * sec, "probe"}, {70 * sec, "waiter"}}},
		{
			name:     "reserve_runs_out",
			policy:   llmretry.Policy{Waits: []time.Duration{sec}, Reserve: 5 * sec},
			deadline: 9 * sec, // 40s: the latest start is 35s
			wantReqs: []sent{{30 * sec, "probe"}},
			stopAt:   35 * sec,
		},
		{
			name:     "reserve_suffices",
			policy:   llmretry.Policy{Waits: []time.Duration{sec}, Reserve: 5 * sec},
			deadline: 14*sec + 1,
			wantReqs: []sent{{30 * sec, "probe"}, {40 * sec, "waiter"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				// Opened, and opened again by a failed probe, by retry-after
				// hints, which a waiting call may wait out.
				br := &llmretry.Breaker{}
				tripFor(t, br, 30*sec)
				// The probe takes 10s; later requests answer at once.
				a := newDesk("a", func(n int) (time.Duration, error) {
					if n == 1 {
						return 10 * sec, tc.probe
					}
					return 0, nil
				})
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
				probe := doAt(context.Background(), c, 30*sec, "probe")

				time.Sleep(31 * sec)
				if st := br.State(); !st.Probing {
					t.Fatalf("State() at 31s = %+v, want a probe in flight", st)
				}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				rec := newRecorder()
				w := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: tc.policy, Breaker: br}}, OnAttempt: rec.OnAttempt}
				got, err := w.Do(ctx, "waiter")
				returned := time.Since(start)
				<-probe
				if diff := cmp.Diff(tc.wantReqs, a.log()); diff != "" {
					t.Errorf("requests to a (-want +got):\n%s", diff)
				}
				if tc.stopAt == 0 {
					if got != "a: waiter" || err != nil {
						t.Errorf("Do() = %q, %v, want %q, nil", got, err, "a: waiter")
					}
					return
				}
				if got, want := returned, tc.stopAt; got != want {
					t.Errorf("Do() returned at %v, want %v", got, want)
				}
				// Half-open already: nothing left to wait for but the probe.
				want := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, start.Add(tc.stopAt), 0, llmretry.NextStop, llmretry.WhyBreaker)}
				want[0].Start, want[0].Elapsed = start.Add(31*sec), tc.stopAt-31*sec // waited for the probe, in vain
				if diff := cmp.Diff(want, exhausted(t, err), attemptOpts); diff != "" {
					t.Errorf("error's records (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A call that skipped the primary for its breaker comes back to it, as the
// last backend it can try, when every backend after it failed for a reason
// about the request; not when one failed for its health.
func TestBreakerSkippedPrimaryRevisited(t *testing.T) {
	trunc := llmretry.Truncation("partial")
	rejected := llmretry.StatusFailure(400, nil, errors.New("bad request"))
	parse := llmretry.ParseFailure("{", errors.New("unexpected end of JSON input"))
	unknown := errors.New("mystery")
	down := busy("down")
	// rec is the record of a later backend's failure: sent at start+at,
	// taking 3s.
	rec := func(bi int, model string, err error, kind llmretry.Kind, status int, raw *string, at time.Duration, next llmretry.Next, why llmretry.Why) func(time.Time) llmretry.Attempt {
		return func(start time.Time) llmretry.Attempt {
			return llmretry.Attempt{Backend: bi, Model: model, Try: 1, Kind: kind, Status: status, Err: err, RawText: raw, Start: start.Add(at), Elapsed: 3 * sec, Next: next, Why: why}
		}
	}
	const fo, stop = llmretry.NextFailOver, llmretry.NextStop
	tests := []struct {
		name     string
		later    []error // the replies of the backends after the primary, each taking 3s
		deadline time.Duration
		want     []func(time.Time) llmretry.Attempt // after the primary's skip
		revisit  bool
		stopAt   time.Duration // when the skip that stops the call is recorded; 0: none
	}{
		{
			// A truncation sends the call back to the skipped primary.
			name: "secondary_truncates", later: []error{trunc}, revisit: true,
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", trunc, llmretry.KindTruncated, 0, ptr("partial"), sec, fo, llmretry.WhyNotRetryable)},
		},
		{
			name: "secondary_rejects", later: []error{rejected}, revisit: true,
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", rejected, llmretry.KindRejected, 400, nil, sec, fo, llmretry.WhyNotRetryable)},
		},
		{
			name: "secondary_parse", later: []error{parse}, revisit: true,
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", parse, llmretry.KindParse, 0, ptr("{"), sec, fo, llmretry.WhyWaitsUsed)},
		},
		{
			name: "secondary_unknown", later: []error{unknown}, revisit: true,
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", unknown, llmretry.KindUnknown, 0, nil, sec, fo, llmretry.WhyNotRetryable)},
		},
		{
			name: "secondary_down", later: []error{down},
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", down, llmretry.KindTransient, 503, nil, sec, stop, llmretry.WhyWaitsUsed)},
		},
		{
			name: "secondary_times_out", later: []error{errTimedOut},
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", errTimedOut, llmretry.KindTimeout, 0, nil, sec, stop, llmretry.WhyWaitsUsed)},
		},
		{
			name: "truncated_then_rejected", later: []error{trunc, rejected}, revisit: true,
			want: []func(time.Time) llmretry.Attempt{
				rec(1, "b", trunc, llmretry.KindTruncated, 0, ptr("partial"), sec, fo, llmretry.WhyNotRetryable),
				rec(2, "c", rejected, llmretry.KindRejected, 400, nil, 4*sec, fo, llmretry.WhyNotRetryable),
			},
		},
		{
			name: "down_then_truncated", later: []error{down, trunc},
			want: []func(time.Time) llmretry.Attempt{
				rec(1, "b", down, llmretry.KindTransient, 503, nil, sec, fo, llmretry.WhyWaitsUsed),
				rec(2, "c", trunc, llmretry.KindTruncated, 0, ptr("partial"), 4*sec, stop, llmretry.WhyNotRetryable),
			},
		},
		{
			name: "rejected_then_down", later: []error{rejected, down},
			want: []func(time.Time) llmretry.Attempt{
				rec(1, "b", rejected, llmretry.KindRejected, 400, nil, sec, fo, llmretry.WhyNotRetryable),
				rec(2, "c", down, llmretry.KindTransient, 503, nil, 4*sec, stop, llmretry.WhyWaitsUsed),
			},
		},
		{
			// Revisited, but the deadline leaves no room to wait: 26s to
			// half-open from 4s leaves 11s of 37s, less than the 20s reserve.
			name: "revisit_past_reserve", later: []error{trunc}, deadline: 40 * sec, stopAt: 4 * sec,
			want: []func(time.Time) llmretry.Attempt{rec(1, "b", trunc, llmretry.KindTruncated, 0, ptr("partial"), sec, fo, llmretry.WhyNotRetryable)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				// Open until 30s by a retry-after hint, which the call
				// that comes back may wait out (a breaker opened by
				// failures bounds the wait by the call's unused waits:
				// breaker_wait_test.go).
				br := &llmretry.Breaker{}
				tripFor(t, br, 30*sec)
				a := newDesk("a", takes(2*sec))
				backends := []backend{{Model: "a", Call: a.Call, Breaker: br}}
				for i, err := range tc.later {
					d := newDesk(string(rune('b'+i)), takes(3*sec, err))
					backends = append(backends, backend{Model: d.name, Call: d.Call})
				}
				rec := newRecorder()
				c := &chain{Backends: backends, OnAttempt: rec.OnAttempt}
				time.Sleep(sec)
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				got, err := c.Do(ctx, "hi")

				want := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, start.Add(sec), 29*sec, fo, llmretry.WhyBreaker)}
				for _, w := range tc.want {
					want = append(want, w(start))
				}
				var wantReqs []sent
				switch {
				case tc.revisit:
					if got != "a: hi" || err != nil {
						t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
					}
					wantReqs = []sent{{30 * sec, "hi"}}
					back := sec + time.Duration(len(tc.later))*3*sec // when the last later backend failed
					want = append(want,
						waitRec(0, "a", 1, llmretry.KindTransient, start.Add(back), 30*sec-back, 30*sec-back),
						okRec(0, "a", 1, start.Add(30*sec), 2*sec))
				case tc.stopAt > 0:
					skip := skipRec(0, "a", 1, llmretry.KindTransient, start.Add(tc.stopAt), 30*sec-tc.stopAt, stop, llmretry.WhyBreaker)
					want = append(want, skip)
					fallthrough
				default:
					if diff := cmp.Diff(want, exhausted(t, err), attemptOpts); diff != "" {
						t.Errorf("error's records (-want +got):\n%s", diff)
					}
				}
				attempts, _ := rec.seen()
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("OnAttempt records (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(wantReqs, a.log()); diff != "" {
					t.Errorf("requests to the primary (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// On a backend with a breaker, a retry-after hint is the wait itself: the
// caller comes back when the breaker half-opens, even when its policy's
// wait is longer. Without a breaker the hint is only a floor.
func TestBreakerRetryAfterIsTheWait(t *testing.T) {
	tests := []struct {
		name     string
		breaker  bool
		hintSecs int
		wantIn   time.Duration
	}{
		{name: "breaker_short_hint", breaker: true, hintSecs: 2, wantIn: 2 * sec},
		{name: "breaker_long_hint", breaker: true, hintSecs: 15, wantIn: 15 * sec},
		{name: "no_breaker_short_hint", hintSecs: 2, wantIn: 10 * sec},
		{name: "no_breaker_long_hint", hintSecs: 15, wantIn: 15 * sec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var br *llmretry.Breaker
				if tc.breaker {
					br = &llmretry.Breaker{}
				}
				hint := limited(tc.hintSecs)
				a := newDesk("a", takes(0, hint))
				rec := newRecorder()
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10 * sec), Breaker: br}}, OnAttempt: rec.OnAttempt}
				if got, err := c.Do(context.Background(), "hi"); got != "a: hi" || err != nil {
					t.Fatalf("Do() = %q, %v, want %q, nil", got, err, "a: hi")
				}
				want := []llmretry.Attempt{
					{Backend: 0, Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: hint, Start: start, RetryAfter: time.Duration(tc.hintSecs) * sec, Next: llmretry.NextRetry, RetryIn: tc.wantIn},
					okRec(0, "a", 2, start.Add(tc.wantIn), 0),
				}
				attempts, _ := rec.seen()
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]sent{{0, "hi"}, {tc.wantIn, "hi"}}, a.log()); diff != "" {
					t.Errorf("requests (-want +got):\n%s", diff)
				}
				if br != nil && br.State() != (llmretry.BreakerState{Opened: 1}) {
					t.Errorf("State() = %+v, want closed: the retry was the probe, and it answered", br.State())
				}
			})
		})
	}
}

// Half-open, one call goes through as the probe: a call with somewhere
// else to go skips, and a call for which it is the last waits for the
// probe; the probe's success closes the breaker.
func TestBreakerHalfOpenLetsOneProbeThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		trip(t, br, busy("down")) // half-opens at 30s
		a := newDesk("a", takes(5*sec))
		b := newFake("b", answers)
		// A 5s wait of its own lets z wait that long for the probe.
		only := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(5 * sec), Breaker: br}}}
		recY := newRecorder()
		both := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}, OnAttempt: recY.OnAttempt}

		x := doAt(context.Background(), both, 30*sec, "x") // the probe, answered at 35s
		y := doAt(context.Background(), both, 31*sec, "y") // skips a
		z := doAt(context.Background(), only, 32*sec, "z") // waits for the probe
		time.Sleep(33 * sec)
		want := llmretry.BreakerState{Open: true, Until: start.Add(30 * sec), Failures: 5, Probing: true, Kind: llmretry.KindTransient, Opened: 1}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() during the probe (-want +got):\n%s", diff)
		}
		for _, tc := range []struct {
			ch   <-chan outcome
			want string
			at   time.Duration
		}{{x, "a: x", 35 * sec}, {y, "b: y", 31 * sec}, {z, "a: z", 40 * sec}} {
			o := <-tc.ch
			if o.resp != tc.want || o.err != nil || o.at.Sub(start) != tc.at {
				t.Errorf("Do() = %q, %v at %v, want %q, nil at %v", o.resp, o.err, o.at.Sub(start), tc.want, tc.at)
			}
		}
		if diff := cmp.Diff([]sent{{30 * sec, "x"}, {35 * sec, "z"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
		attempts, _ := recY.seen()
		var ys []llmretry.Attempt
		for _, at := range attempts {
			if at.Start.Equal(start.Add(31 * sec)) {
				ys = append(ys, at)
			}
		}
		// Half-open already: RetryAfter is zero.
		wantY := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, start.Add(31*sec), 0, llmretry.NextFailOver, llmretry.WhyBreaker),
			okRec(1, "b", 1, start.Add(31*sec), 0),
		}
		if diff := cmp.Diff(wantY, ys, attemptOpts); diff != "" {
			t.Errorf("records of the call that skipped (-want +got):\n%s", diff)
		}
		if st := br.State(); st != (llmretry.BreakerState{Opened: 1}) {
			t.Errorf("State() after the probe answered = %+v, want closed", st)
		}
	})
}

// The probe's failure opens the breaker again for Cooldown (not doubled),
// or until its own retry-after, longer or shorter. A probe that failed for
// a reason about its request found the backend up.
func TestBreakerProbeOutcome(t *testing.T) {
	tests := []struct {
		name    string
		probe   error                 // at 11s
		hang    bool                  // the probe hangs until the 2s Timeout ends it
		want    llmretry.BreakerState // Until from the start; zero Until when closed
		wantFor time.Duration
	}{
		{name: "answers", probe: nil, want: llmretry.BreakerState{Opened: 1}},
		{name: "busy", probe: busy("down"), wantFor: 11*sec + 10*sec, want: llmretry.BreakerState{Open: true, Failures: 6, Kind: llmretry.KindTransient, Opened: 2}},
		{name: "times_out", hang: true, wantFor: 12*sec + 10*sec, want: llmretry.BreakerState{Open: true, Failures: 6, Kind: llmretry.KindTimeout, Opened: 2}},
		{name: "retry_after_longer", probe: limited(45), wantFor: 11*sec + 45*sec, want: llmretry.BreakerState{Open: true, Failures: 6, Kind: llmretry.KindTransient, Opened: 2}},
		{name: "retry_after_shorter", probe: limited(2), wantFor: 11*sec + 2*sec, want: llmretry.BreakerState{Open: true, Failures: 6, Kind: llmretry.KindTransient, Opened: 2}},
		{name: "truncated", probe: llmretry.Truncation("partial"), want: llmretry.BreakerState{Opened: 1}},
		{name: "rejected", probe: llmretry.StatusFailure(400, nil, errors.New("bad request")), want: llmretry.BreakerState{Opened: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				br := &llmretry.Breaker{Cooldown: 10 * sec}
				trip(t, br, busy("down")) // half-opens at 10s
				a := newDesk("a", func(n int) (time.Duration, error) {
					if tc.hang {
						return time.Hour, nil
					}
					return sec, tc.probe
				})
				// The Timeout ends a hang at 12s; a reply comes at 11s.
				c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Timeout: 2 * sec, Breaker: br}}}
				time.Sleep(10 * sec)
				c.Do(context.Background(), "probe")
				want := tc.want
				if tc.wantFor > 0 {
					want.Until = start.Add(tc.wantFor)
				}
				if diff := cmp.Diff(want, br.State()); diff != "" {
					t.Errorf("State() after the probe (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]sent{{10 * sec, "probe"}}, a.log()); diff != "" {
					t.Errorf("requests (-want +got):\n%s", diff)
				}
			})
		})
	}
	t.Run("fails_twice", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			br := &llmretry.Breaker{Cooldown: 10 * sec}
			trip(t, br, busy("down"))
			a := newDesk("a", takes(sec, busy("1"), busy("2")))
			c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			time.Sleep(10 * sec)
			c.Do(context.Background(), "first") // fails at 11s: open until 21s
			time.Sleep(10 * sec)
			c.Do(context.Background(), "second") // fails at 22s: open until 32s, not doubled
			want := llmretry.BreakerState{Open: true, Until: start.Add(32 * sec), Failures: 7, Kind: llmretry.KindTransient, Opened: 3}
			if diff := cmp.Diff(want, br.State()); diff != "" {
				t.Errorf("State() after two failed probes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]sent{{10 * sec, "first"}, {21 * sec, "second"}}, a.log()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	})
}

// A probe whose caller withdrew learned nothing: the breaker stays
// half-open and the next call gets the probe.
func TestBreakerCancelledProbePassesTheTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		trip(t, br, busy("down"))
		a := newDesk("a", takes(sec))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		ctx, cancel := context.WithCancel(context.Background())
		x := doAt(ctx, c, 30*sec, "x")
		y := doAt(context.Background(), c, 30*sec+500*ms, "y") // waits for x's probe
		time.Sleep(30*sec + 200*ms)
		cancel()
		if o := <-x; !errors.Is(o.err, context.Canceled) {
			t.Errorf("cancelled probe: Do() = %q, %v, want a *Cancelled", o.resp, o.err)
		}
		if want := (llmretry.BreakerState{Open: true, Until: start.Add(30 * sec), Failures: 5, Kind: llmretry.KindTransient, Opened: 1}); br.State() != want {
			t.Errorf("State() after the cancelled probe = %+v, want %+v", br.State(), want)
		}
		if o := <-y; o.resp != "a: y" || o.err != nil {
			t.Errorf("next call: Do() = %q, %v, want %q, nil", o.resp, o.err, "a: y")
		}
		if diff := cmp.Diff([]sent{{30 * sec, "x"}, {30*sec + 500*ms, "y"}}, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
}

// 100 concurrent calls through one half-open breaker: exactly one probe at
// a time, and the probe goes to the waiting call whose Do began first,
// whatever order the calls reached the breaker in and however the
// goroutines are scheduled. The earliest call reaches it last, through a
// secondary that truncates. When the probe answers, the others go in line
// order, a millisecond apart.
func TestBreakerHundredCallsOneProbe(t *testing.T) {
	trunc := llmretry.Truncation("partial")
	for run := range 20 {
		perm := rand.Perm(100)
		name := func(i int) string { return fmt.Sprintf("c%02d", perm[i]) }
		synctest.Test(t, func(t *testing.T) {
			// Opened by retry-after hints, which the calls wait out.
			br := &llmretry.Breaker{}
			tripFor(t, br, 30*sec) // half-opens at 30s
			// The first probe fails at 31s, opening it until 61s; the
			// second answers at 62s.
			a := newDesk("a", takes(sec, hintFailure(30*sec)))
			b := newDesk("b", func(int) (time.Duration, error) { return 3 * sec, trunc })
			only := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			both := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}

			outs := make([]<-chan outcome, 100)
			// Started in a random order; they begin at 2s, all at once.
			for _, i := range rand.Perm(98) {
				outs[i+2] = doAt(context.Background(), only, 2*sec, name(i+2))
			}
			// The two earliest calls skip a, and come back to it after b
			// truncates: they wait from 4s and 4.5s, after the others.
			outs[0] = doAt(context.Background(), both, sec, name(0))
			outs[1] = doAt(context.Background(), both, 1500*ms, name(1))

			for i, ch := range outs {
				o := <-ch
				switch {
				case i == 0:
					var tr *llmretry.Truncated
					if !errors.As(o.err, &tr) {
						t.Errorf("run %d: call %s (began first, its probe failed): Do() = %q, %v, want a *Truncated", run, name(i), o.resp, o.err)
					}
				case o.resp != "a: "+name(i) || o.err != nil:
					t.Errorf("run %d: call %s: Do() = %q, %v, want %q, nil", run, name(i), o.resp, o.err, "a: "+name(i))
				}
			}
			reqs := a.log()
			if len(reqs) != 100 {
				t.Fatalf("run %d: a received %d requests, want 100", run, len(reqs))
			}
			want := []sent{{30 * sec, name(0)}, {61 * sec, name(1)}}
			if diff := cmp.Diff(want, reqs[:2]); diff != "" {
				t.Errorf("run %d: the probes (-want +got):\n%s", run, diff)
			}
			for k, r := range reqs[2:] {
				if want := 62*sec + time.Duration(k)*ms; r.At != want {
					t.Errorf("run %d: request %v, want the %d-th of the others at %v: from 62s, when the probe answered, a millisecond apart", run, r, k, want)
				}
			}
		})
	}
}

// A call waiting on the breaker returns a *Cancelled as soon as its caller
// withdraws, its record saying stop and cancelled, and leaves the line: the
// next call gets the probe.
func TestBreakerCancelledWhileWaiting(t *testing.T) {
	cause := errors.New("user left")
	tests := []struct {
		name      string
		probe     bool          // a probe is in flight from 30s to 40s
		cancelAt  time.Duration // the waiter is sent at 1s, or 31s with a probe
		wantAfter time.Duration // the skip's RetryAfter
		nextAt    time.Duration // a call with somewhere else to go, which must get through to a
	}{
		{name: "waiting_for_half_open", cancelAt: 11 * sec, wantAfter: 19 * sec, nextAt: 30 * sec},
		{name: "waiting_for_the_probe", probe: true, cancelAt: 33 * sec, wantAfter: 0, nextAt: 41 * sec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				// Opened by a retry-after hint, which the waiter may wait
				// out.
				br := &llmretry.Breaker{}
				tripFor(t, br, 30*sec)
				lat := time.Duration(0)
				if tc.probe {
					lat = 10 * sec
				}
				a := newDesk("a", func(n int) (time.Duration, error) {
					if n == 1 {
						return lat, nil
					}
					return 0, nil
				})
				b := newFake("b", answers)
				only := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
				both := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
				var probe <-chan outcome
				sendAt := sec
				if tc.probe {
					probe = doAt(context.Background(), only, 30*sec, "probe")
					sendAt = 31 * sec
				}
				ctx, cancel := context.WithCancelCause(context.Background())
				rec := newRecorder()
				waiter := &chain{Backends: only.Backends, OnAttempt: rec.OnAttempt}
				w := make(chan outcome, 1)
				go func() {
					time.Sleep(sendAt)
					resp, err := waiter.Do(ctx, "waiter")
					w <- outcome{resp, err, time.Now()}
				}()
				time.Sleep(tc.cancelAt)
				cancel(cause)
				o := <-w
				if got := o.at.Sub(start); got != tc.cancelAt {
					t.Errorf("Do() returned at %v, want %v: at once", got, tc.cancelAt)
				}
				var ca *llmretry.Cancelled
				if !errors.As(o.err, &ca) {
					t.Fatalf("Do() = %q, %v, want a *Cancelled", o.resp, o.err)
				}
				if !errors.Is(o.err, context.Canceled) || ca.Cause != cause {
					t.Errorf("Do() error = %v with Cause %v, want context.Canceled and cause %v", o.err, ca.Cause, cause)
				}
				want := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, start.Add(tc.cancelAt), tc.wantAfter, llmretry.NextStop, llmretry.WhyCancelled)}
				want[0].Start, want[0].Elapsed = start.Add(sendAt), tc.cancelAt-sendAt // the wait, in vain
				if diff := cmp.Diff(want, ca.Attempts, attemptOpts); diff != "" {
					t.Errorf("error's records (-want +got):\n%s", diff)
				}
				attempts, _ := rec.seen()
				if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
					t.Errorf("OnAttempt records (-want +got):\n%s", diff)
				}
				// The waiter left the line: a call that would skip if
				// anyone still waited goes through as the probe.
				next := doAt(context.Background(), both, tc.nextAt-tc.cancelAt, "next")
				if o := <-next; o.resp != "a: next" || o.err != nil {
					t.Errorf("next call at %v: Do() = %q, %v, want %q, nil", tc.nextAt, o.resp, o.err, "a: next")
				}
				if probe != nil {
					<-probe
				}
				if st := br.State(); st != (llmretry.BreakerState{Opened: 1}) {
					t.Errorf("State() at the end = %+v, want closed", st)
				}
			})
		})
	}
}

// State gives a dashboard the breaker through an outage and its recovery.
func TestBreakerStateReadings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{Failures: 3, Cooldown: 20 * sec}
		var read []llmretry.BreakerState
		a := newDesk("a", takes(sec, busy("1"), busy("2"), busy("3")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		read = append(read, br.State())
		for range 3 {
			c.Do(context.Background(), "hi") // each fails after 1s
			read = append(read, br.State())
		}
		time.Sleep(30 * sec) // half-open since 23s
		read = append(read, br.State())
		probe := doAt(context.Background(), c, 0, "probe")
		time.Sleep(500 * ms)
		read = append(read, br.State())
		<-probe
		read = append(read, br.State())
		until := start.Add(23 * sec)
		want := []llmretry.BreakerState{
			{},
			{Failures: 1},
			{Failures: 2},
			{Open: true, Until: until, Failures: 3, Kind: llmretry.KindTransient, Opened: 1},
			{Open: true, Until: until, Failures: 3, Kind: llmretry.KindTransient, Opened: 1},                // half-open: Until has passed
			{Open: true, Until: until, Failures: 3, Probing: true, Kind: llmretry.KindTransient, Opened: 1}, // the probe in flight
			{Opened: 1},
		}
		if diff := cmp.Diff(want, read); diff != "" {
			t.Errorf("State() readings (-want +got):\n%s", diff)
		}
	})
}

// RetryItemAfter of an error whose last attempts were skips is the time
// until the soonest of those breakers half-opens, counted when asked.
func TestBreakerRetryItemAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		brA := &llmretry.Breaker{}
		trip(t, brA, busy("down")) // until 30s
		time.Sleep(10 * sec)
		brB := &llmretry.Breaker{Cooldown: 10 * sec}
		trip(t, brB, busy("down")) // until 20s
		a, b := newFake("a", answers), newFake("b", answers)
		time.Sleep(5 * sec)
		// The deadline reserves 4s: neither breaker half-opens in time.
		ctx, cancel := context.WithTimeout(context.Background(), 8*sec)
		defer cancel()
		one := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: brA}}}
		_, errOne := one.Do(ctx, "hi")
		two := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: brA}, {Model: "b", Call: b.Call, Breaker: brB}}}
		_, errTwo := two.Do(ctx, "hi")
		wantTwo := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, start.Add(15*sec), 15*sec, llmretry.NextFailOver, llmretry.WhyBreaker),
			skipRec(1, "b", 1, llmretry.KindTransient, start.Add(15*sec), 5*sec, llmretry.NextStop, llmretry.WhyBreaker),
		}
		if diff := cmp.Diff(wantTwo, exhausted(t, errTwo), attemptOpts); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		for _, tc := range []struct {
			err   error
			after time.Duration // from 15s
			want  time.Duration
		}{
			{errOne, 0, 15 * sec},
			{errTwo, 0, 5 * sec},
			{errOne, 4 * sec, 11 * sec},
			{errTwo, 4 * sec, sec},
			{errTwo, 5 * sec, 0},
		} {
			time.Sleep(time.Until(start.Add(15*sec + tc.after)))
			got, ok := llmretry.RetryItemAfter(tc.err)
			if got != tc.want || ok != (tc.want > 0) {
				t.Errorf("at %v: RetryItemAfter() = %v, %t, want %v, %t", 15*sec+tc.after, got, ok, tc.want, tc.want > 0)
			}
		}
		// b's breaker has half-opened: whichever backend the advice looks
		// at first, there is nothing to wait for.
		for range 20 {
			if got, ok := llmretry.RetryItemAfter(errTwo); ok {
				t.Errorf("at 20s, asked again: RetryItemAfter() = %v, true, want 0, false: b's breaker has half-opened", got)
				break
			}
		}
		if !llmretry.RetryItem(errTwo) {
			t.Errorf("RetryItem() = false, want true: the breakers will half-open")
		}
		if a.times() != nil || b.times() != nil {
			t.Errorf("backends received %v and %v, want nothing", a.times(), b.times())
		}
	})
}

func TestBreakerValidate(t *testing.T) {
	tests := []struct {
		name     string
		failures int
		cooldown time.Duration
		want     string // "" for valid
	}{
		{name: "zero"},
		{name: "set", failures: 3, cooldown: sec},
		{name: "negative_failures", failures: -1, want: "llmretry: backend 1 (b): breaker failures or cooldown is negative"},
		{name: "negative_cooldown", cooldown: -sec, want: "llmretry: backend 1 (b): breaker failures or cooldown is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := newFake("a", always(busy("down"))), newFake("b", answers)
			br := &llmretry.Breaker{Failures: tc.failures, Cooldown: tc.cooldown}
			c := &chain{Backends: []backend{{Model: "a", Call: a.Call}, {Model: "b", Call: b.Call, Breaker: br}}}
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			checkConfigErr(t, "Validate()", err, tc.want)
			_, err = c.Do(context.Background(), "hi")
			checkConfigErr(t, "Do()", err, tc.want)
			if a.times() != nil || b.times() != nil {
				t.Errorf("backends received %v and %v, want nothing", a.times(), b.times())
			}
		})
	}
}

// No goroutine of Do's outlives it, and no waiter stays in the breaker's
// line: after waiters that were cancelled, stopped by their reserve and
// answered, the bubble holds only what it held before, and a call with
// somewhere else to go is let through.
func TestBreakerLeavesNothingBehind(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	synctest.Test(t, func(t *testing.T) {
		before := runtime.NumGoroutine()
		start := time.Now()
		br := &llmretry.Breaker{}
		tripFor(t, br, 30*sec) // a retry-after hint: the calls may wait it out
		a := newDesk("a", func(n int) (time.Duration, error) {
			if n == 1 {
				return 10 * sec, nil // the probe, from 30s to 40s
			}
			return 0, nil
		})
		only := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		tight := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: 5 * sec}, Breaker: br}}}
		cctx, cancel := context.WithCancel(context.Background())
		dctx, dcancel := context.WithDeadline(context.Background(), start.Add(40*sec))
		defer dcancel()
		cancelled := doAt(cctx, only, sec, "cancelled")
		probe := doAt(context.Background(), only, 30*sec, "probe")
		reserve := doAt(dctx, tight, 31*sec, "reserve") // stops at 35s
		after := doAt(context.Background(), only, 32*sec, "after")
		time.Sleep(5 * sec)
		cancel()
		for _, ch := range []<-chan outcome{cancelled, probe, reserve, after} {
			<-ch
		}
		synctest.Wait()
		if n := runtime.NumGoroutine(); n > before {
			t.Errorf("%d goroutines after every Do returned, want at most the %d before", n, before)
		}
		if st := br.State(); st != (llmretry.BreakerState{Opened: 1}) {
			t.Errorf("State() = %+v, want closed", st)
		}
		want := []sent{{30 * sec, "probe"}, {40 * sec, "after"}}
		if diff := cmp.Diff(want, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
}

// Do's records with a breaker are what OnAttempt saw, but for the
// documented correction: a wait that the caller's withdrawal ended.
func TestBreakerRecordsMatchOnAttempt(t *testing.T) {
	trunc := llmretry.Truncation("partial")
	tests := []struct {
		name   string
		br     *llmretry.Breaker
		policy llmretry.Policy
		a      []error // the primary's replies, each at once
		b      error   // nil: no secondary
		cancel time.Duration
		n      int // records
	}{
		// Skipped, revisited after b truncates, and the probe fails.
		{name: "revisit_probe_fails", br: &llmretry.Breaker{}, a: []error{busy("still down")}, b: trunc, n: 3},
		// a's own failures open it between tries: rather than wait only to
		// skip, it fails over at once (why "breaker"), is revisited after b
		// truncates, and retried while probes fail until the waits run out.
		{name: "opened_between_tries", br: &llmretry.Breaker{Failures: 2}, policy: waits(sec, sec), a: []error{busy("1"), busy("2"), busy("3")}, b: trunc, n: 4}, // the come-back is a's third and last try
		// Cancelled during the policy's wait after a failure that opened
		// it: the record says stop and cancelled, OnAttempt saw a retry.
		{name: "cancelled_in_wait", br: &llmretry.Breaker{Failures: 1}, policy: waits(5 * sec), a: []error{busy("1")}, cancel: 2 * sec, n: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				if tc.name == "revisit_probe_fails" {
					trip(t, tc.br, busy("down"))
				}
				a := newDesk("a", takes(0, tc.a...))
				backends := []backend{{Model: "a", Call: a.Call, Retry: tc.policy, Breaker: tc.br}}
				if tc.b != nil {
					b := newDesk("b", func(int) (time.Duration, error) { return 0, tc.b })
					backends = append(backends, backend{Model: "b", Call: b.Call})
				}
				rec := newRecorder()
				c := &chain{Backends: backends, OnAttempt: rec.OnAttempt}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancel > 0 {
					time.AfterFunc(tc.cancel, cancel)
				}
				_, err := c.Do(ctx, "hi")
				var got []llmretry.Attempt
				var ca *llmretry.Cancelled
				if errors.As(err, &ca) {
					got = ca.Attempts
				} else {
					got = exhausted(t, err)
				}
				seen, _ := rec.seen()
				if len(got) != tc.n {
					t.Errorf("Do() error has %d records, want %d:\n%v", len(got), tc.n, err)
				}
				if tc.cancel > 0 {
					// The documented correction.
					last := &seen[len(seen)-1]
					if last.Next != llmretry.NextRetry {
						t.Fatalf("OnAttempt saw %v, want a retry", *last)
					}
					last.Next, last.Why, last.RetryIn = llmretry.NextStop, llmretry.WhyCancelled, 0
				}
				if diff := cmp.Diff(seen, got, attemptOpts); diff != "" {
					t.Errorf("error's records against OnAttempt's (-OnAttempt +error):\n%s", diff)
				}
			})
		})
	}
}

// The rule is that a call waiting for its last backend's breaker
// waits for a probe in flight only while the wait passes the checks a
// retry-after hint passes; MaxWait is one of them. Without a deadline,
// a probe that hangs must not park the caller past its MaxWait.
func TestBreakerProbeWaitBoundedByMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		trip(t, br, busy("down"))
		a := newDesk("a", takes(10*time.Minute)) // the probe hangs for 10 minutes
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		probe := doAt(context.Background(), c, 30*sec, "probe")
		time.Sleep(31 * sec)
		w := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: 5 * sec}, Breaker: br}}}
		got, err := w.Do(context.Background(), "waiter")
		returned := time.Since(start)
		<-probe
		if returned > 36*sec {
			t.Errorf("Do() returned at %v (%q, %v), want by 36s: its MaxWait is 5s", returned, got, err)
		}
		if err == nil {
			return
		}
		want := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, time.Time{}, 0, llmretry.NextStop, llmretry.WhyBreaker)}
		if diff := cmp.Diff(want, exhausted(t, err), attemptOpts, ignoreTimes); diff != "" {
			t.Errorf("error's records (-want +got):\n%s", diff)
		}
	})
}

// When a caller that got a retry-after hint comes back at the moment the
// breaker half-opens, it contends for the probe with calls that waited;
// the one whose Do began first must get it, in every run, not whichever
// goroutine the scheduler runs first.
func TestBreakerProbeOrderAtHalfOpenIsScheduleFree(t *testing.T) {
	got := map[string]int{}
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			br := &llmretry.Breaker{}
			// x's request, sent at 0, is refused at 1s for 10s: the breaker
			// half-opens at 11s, when x comes back; y waits from 2s.
			a := newDesk("a", takes(sec, limited(10)))
			x := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(sec), Breaker: br}}}
			y := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			ox := doAt(context.Background(), x, 0, "x")
			oy := doAt(context.Background(), y, 2*sec, "y")
			<-ox
			<-oy
			got[fmt.Sprint(a.log())]++
		})
	}
	want := map[string]int{fmt.Sprint([]sent{{0, "x"}, {11 * sec, "x"}, {12 * sec, "y"}}): 50}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests to a over 50 runs, counted (-want +got):\n%s", diff)
	}
}

// A call waiting for a probe in flight with no reserve wakes at its
// deadline, the same instant the context's own timer ends it. The outcome
// must not depend on which runs first: the deadline has come, so the skip
// says "deadline" and the error is a *TimedOut either way.
func TestBreakerWaitToTheDeadlineIsDeterministic(t *testing.T) {
	got := map[string]int{}
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			br := &llmretry.Breaker{}
			trip(t, br, busy("down"))
			a := newDesk("a", takes(10*sec)) // the probe, from 30s to 40s
			c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			probe := doAt(context.Background(), c, 30*sec, "probe")
			time.Sleep(31 * sec)
			ctx, cancel := context.WithTimeout(context.Background(), 4*sec)
			defer cancel()
			// MaxTries lets the repeated wait cover the deadline, so the
			// bound for the breaker is the deadline itself.
			w := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: llmretry.Policy{Waits: []time.Duration{sec}, Reserve: -1, MaxTries: 10}, Breaker: br}}}
			_, err := w.Do(ctx, "waiter")
			<-probe
			attempts := exhausted(t, err)
			got[fmt.Sprintf("%T %s", err, attempts[len(attempts)-1].Why)]++
		})
	}
	want := map[string]int{"*llmretry.TimedOut deadline": 50}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes over 50 runs, counted (-want +got):\n%s", diff)
	}
}

// A probe's failure reopens the breaker for Cooldown even when the count
// alone would not: here a retry-after hint opened it after one failure.
func TestBreakerProbeFailureReopensBelowTheCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{Cooldown: 10 * sec}
		a := newDesk("a", takes(0, limited(20), busy("still down")))
		b := newFake("b", answers)
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}, {Model: "b", Call: b.Call}}}
		c.Do(context.Background(), "hinted") // open until 20s, one failure counted
		time.Sleep(20 * sec)
		c.Do(context.Background(), "probe") // fails at 20s: two failures, of five
		want := llmretry.BreakerState{Open: true, Until: start.Add(30 * sec), Failures: 2, Kind: llmretry.KindTransient, Opened: 2}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() after the probe failed (-want +got):\n%s", diff)
		}
	})
}

// Opened counts openings, not failures: failures that end while the
// breaker is already open (calls let through before it opened, a hint
// that only lengthens the open period) keep it open without opening it
// again. Only a failed probe at half-open opens it anew.
func TestBreakerOpenedCountsOpeningsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{Failures: 1, Cooldown: 30 * sec}
		// Three calls let through while closed, ending 1s, 2s and 3s in;
		// the third with a hint past the cool-down.
		a := newDesk("a", func(n int) (time.Duration, error) {
			switch n {
			case 1:
				return sec, busy("first")
			case 2:
				return 2 * sec, busy("second")
			case 3:
				return 3 * sec, limited(60)
			}
			return sec, busy("probe")
		})
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		calls := []<-chan outcome{
			doAt(context.Background(), c, 0, "x"),
			doAt(context.Background(), c, 0, "y"),
			doAt(context.Background(), c, 0, "z"),
		}
		for _, o := range calls {
			<-o
		}
		want := llmretry.BreakerState{Open: true, Until: start.Add(63 * sec), Failures: 3, Kind: llmretry.KindTransient, Opened: 1}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() after three failures while open (-want +got):\n%s", diff)
		}
		time.Sleep(time.Until(start.Add(63 * sec)))
		c.Do(context.Background(), "probe") // fails at 64s: opened again
		want = llmretry.BreakerState{Open: true, Until: start.Add(94 * sec), Failures: 4, Kind: llmretry.KindTransient, Opened: 2}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() after the failed probe (-want +got):\n%s", diff)
		}
	})
}

// A success of an attempt sent before the breaker opened closes it, open
// or half-open: the backend has just answered. Call A's request, sent at
// 0s, is answered at 5s; call B's, sent at 0s too, fails at 1s and opens
// the breaker.
func TestBreakerClosedBySuccessSentBeforeItOpened(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cooldown time.Duration // open until 1s + cooldown
	}{
		{"open", 30 * time.Second},
		{"half_open", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				br := &llmretry.Breaker{Failures: 1, Cooldown: tc.cooldown}
				c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
					Model:   "a",
					Breaker: br,
					Call: func(ctx context.Context, req string) (string, error) {
						if req == "B" {
							time.Sleep(time.Second)
							return "", llmretry.StatusFailure(503, nil, nil)
						}
						time.Sleep(5 * time.Second)
						return "answer", nil
					},
				}}}
				done := make(chan error)
				go func() {
					_, err := c.Do(context.Background(), "B")
					done <- err
				}()
				got, err := c.Do(context.Background(), "A")
				if got != "answer" || err != nil {
					t.Fatalf("Do(A) = %q, %v, want the answer", got, err)
				}
				if err := <-done; err == nil {
					t.Fatal("Do(B) = nil error, want its 503")
				}
				if diff := cmp.Diff(llmretry.BreakerState{Opened: 1}, br.State()); diff != "" {
					t.Errorf("State() after A's success (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// A probe whose Call panics learned nothing about the backend, but must
// not hold the breaker half-open for good: once the panic is recovered,
// the next call gets the probe and its request reaches the backend.
func TestPanickingProbeReleasesBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		trip(t, br, busy("down")) // half-opens at 30s
		a := newDesk("a", takes(0))
		call := func(ctx context.Context, req string) (string, error) {
			resp, err := a.Call(ctx, req)
			if req == "boom" {
				panic("backend bug")
			}
			return resp, err
		}
		c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
		time.Sleep(30 * sec)

		var got any
		func() {
			defer func() { got = recover() }()
			c.Do(context.Background(), "boom")
		}()
		if got != "backend bug" {
			t.Fatalf("recover() = %v, want the backend's panic %q", got, "backend bug")
		}
		// Still half-open, as before the probe: the panic counts for nothing.
		want := llmretry.BreakerState{Open: true, Until: start.Add(30 * sec), Failures: 5, Kind: llmretry.KindTransient, Opened: 1}
		if diff := cmp.Diff(want, br.State()); diff != "" {
			t.Errorf("State() after the panicking probe (-want +got):\n%s", diff)
		}

		time.Sleep(sec)
		if resp, err := c.Do(context.Background(), "next"); resp != "a: next" || err != nil {
			t.Errorf("Do() after the panic = %q, %v, want %q, nil", resp, err, "a: next")
		}
		if diff := cmp.Diff([]sent{{30 * sec, "boom"}, {31 * sec, "next"}}, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
		if st := br.State(); st != (llmretry.BreakerState{Opened: 1}) {
			t.Errorf("State() after the next probe answered = %+v, want closed", st)
		}
	})
}

// An attempt ended by its caller's own deadline says nothing about the
// backend: it neither counts towards opening the breaker nor, as a probe,
// opens it again.
func TestCallerDeadlineDoesNotCountAgainstBreaker(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			br := &llmretry.Breaker{} // opens after 5
			a := newDesk("a", takes(2*sec))
			c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			var wantReqs []sent
			for i := range 5 {
				wantReqs = append(wantReqs, sent{time.Duration(i) * 500 * ms, "hi"})
				ctx, cancel := context.WithTimeout(context.Background(), 500*ms)
				_, err := c.Do(ctx, "hi")
				cancel()
				if !isTimedOut(err) {
					t.Errorf("call %d: Do() error = %v (%T), want a *TimedOut", i+1, err, err)
				}
			}
			if st := br.State(); st != (llmretry.BreakerState{}) {
				t.Errorf("State() after five callers' deadlines = %+v, want closed with Failures 0", st)
			}
			if diff := cmp.Diff(wantReqs, a.log()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	})
	t.Run("probe", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			br := &llmretry.Breaker{}
			trip(t, br, busy("down")) // half-opens at 30s
			a := newDesk("a", takes(2*sec, nil))
			c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
			time.Sleep(30 * sec)
			ctx, cancel := context.WithTimeout(context.Background(), 500*ms)
			_, err := c.Do(ctx, "probe") // ended at 30.5s by its caller
			cancel()
			if !isTimedOut(err) {
				t.Errorf("probe: Do() error = %v (%T), want a *TimedOut", err, err)
			}
			want := llmretry.BreakerState{Open: true, Until: start.Add(30 * sec), Failures: 5, Kind: llmretry.KindTransient, Opened: 1}
			if diff := cmp.Diff(want, br.State()); diff != "" {
				t.Errorf("State() after the probe's caller's deadline (-want +got):\n%s", diff)
			}
			time.Sleep(500 * ms)
			if resp, err := c.Do(context.Background(), "next"); resp != "a: next" || err != nil {
				t.Errorf("next call: Do() = %q, %v, want %q, nil", resp, err, "a: next")
			}
			if diff := cmp.Diff([]sent{{30 * sec, "probe"}, {31 * sec, "next"}}, a.log()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	})
}

// A nested chain makes one attempt per backend and never waits, not even
// for the breaker of its last backend: it returns at once with a skip
// whose RetryAfter, the time to half-open, becomes the outer attempt's
// hint.
func TestNestedChainDoesNotWaitForBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		br := &llmretry.Breaker{}
		trip(t, br, busy("down")) // half-opens at 30s
		a := newDesk("a", takes(0))
		inner := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		var innerErrs []error
		var innerAt []time.Duration // when each inner Do returned
		run := func(ctx context.Context, req string) (string, error) {
			resp, err := inner.Do(ctx, req)
			innerAt = append(innerAt, time.Since(start))
			if err != nil {
				innerErrs = append(innerErrs, err)
			}
			return resp, err
		}
		rec := newRecorder()
		outer := &chain{Backends: []backend{{Model: "outer", Call: run, Retry: waits(sec)}}, OnAttempt: rec.OnAttempt}
		time.Sleep(10 * sec)
		if resp, err := outer.Do(context.Background(), "hi"); resp != "a: hi" || err != nil {
			t.Fatalf("Do() = %q, %v, want %q, nil", resp, err, "a: hi")
		}
		// At once with the skip, then with the answer after the outer wait.
		if diff := cmp.Diff([]time.Duration{10 * sec, 30 * sec}, innerAt); diff != "" {
			t.Errorf("times the inner Do returned (-want +got):\n%s", diff)
		}
		if len(innerErrs) != 1 {
			t.Fatalf("inner chain failed %d times, want once: %v", len(innerErrs), innerErrs)
		}
		wantInner := []llmretry.Attempt{skipRec(0, "a", 1, llmretry.KindTransient, start.Add(10*sec), 20*sec, llmretry.NextStop, llmretry.WhyBreaker)}
		if diff := cmp.Diff(wantInner, exhausted(t, innerErrs[0]), attemptOpts); diff != "" {
			t.Errorf("inner chain's records (-want +got):\n%s", diff)
		}
		wantOuter := []llmretry.Attempt{
			{Backend: 0, Model: "outer", Try: 1, Kind: llmretry.KindTransient, Err: innerErrs[0], Start: start.Add(10 * sec), RetryAfter: 20 * sec, Next: llmretry.NextRetry, RetryIn: 20 * sec},
			okRec(0, "outer", 2, start.Add(30*sec), 0),
		}
		attempts, _ := rec.seen()
		if diff := cmp.Diff(wantOuter, attempts, attemptOpts); diff != "" {
			t.Errorf("outer chain's records (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{30 * sec, "hi"}}, a.log()); diff != "" {
			t.Errorf("requests to a (-want +got):\n%s", diff)
		}
	})
}

// A retry-after hint on a failure that is about the request, not the
// backend's health, does not open the breaker: the next call's request
// goes straight through.
func TestHintOnRejectedDoesNotOpenBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.Header{}
		h.Set("Retry-After", "10")
		h.Set("X-Should-Retry", "false")
		refused := llmretry.StatusFailure(http.StatusTooManyRequests, h, errors.New("quota for this request"))
		if refused.Kind != llmretry.KindRejected || refused.RetryAfter != 10*sec {
			t.Fatalf("StatusFailure() = Kind %v, RetryAfter %v, want rejected, 10s", refused.Kind, refused.RetryAfter)
		}
		br := &llmretry.Breaker{}
		a := newDesk("a", takes(0, refused))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Breaker: br}}}
		if _, err := c.Do(context.Background(), "x"); !lastErrIs(err, refused) {
			t.Fatalf("Do() error = %v, want the rejection as its last record's Err", err)
		}
		if st := br.State(); st != (llmretry.BreakerState{}) {
			t.Errorf("State() after a rejection with a hint = %+v, want closed with Failures 0", st)
		}
		if resp, err := c.Do(context.Background(), "y"); resp != "a: y" || err != nil {
			t.Errorf("next call: Do() = %q, %v, want %q, nil", resp, err, "a: y")
		}
		if diff := cmp.Diff([]sent{{0, "x"}, {0, "y"}}, a.log()); diff != "" {
			t.Errorf("requests (-want +got):\n%s", diff)
		}
	})
}

// Breaker skips of Kind timeout say the backends were down, not that this
// call ran out of time: an error whose records are only such skips is a
// plain *Exhausted, not a *TimedOut.
func TestBreakerSkipsAloneAreExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		brA, brB := &llmretry.Breaker{}, &llmretry.Breaker{}
		trip(t, brA, errTimedOut) // both half-open at 30s
		trip(t, brB, errTimedOut)
		a := newDesk("a", takes(0))
		b := newDesk("b", takes(0))
		c := &chain{Backends: []backend{
			{Model: "a", Call: a.Call, Breaker: brA},
			{Model: "b", Call: b.Call, Breaker: brB},
		}}
		// 20s left reserves 10s: b may be waited for until 10s, and it
		// half-opens at 30s.
		ctx, cancel := context.WithTimeout(context.Background(), 20*sec)
		defer cancel()
		_, err := c.Do(ctx, "hi")
		want := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTimeout, start, 30*sec, llmretry.NextFailOver, llmretry.WhyBreaker),
			skipRec(1, "b", 1, llmretry.KindTimeout, start, 30*sec, llmretry.NextStop, llmretry.WhyBreaker),
		}
		checkPlain := func(what string, err error) {
			t.Helper()
			if _, ok := err.(*llmretry.Exhausted); !ok {
				t.Errorf("%s = %v (%T), want a plain *llmretry.Exhausted", what, err, err)
			}
			if isTimedOut(err) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s = %v (%T), want no *TimedOut and no match for context.DeadlineExceeded", what, err, err)
			}
		}
		checkPlain("Do() error", err)
		if diff := cmp.Diff(want, exhausted(t, err), attemptOpts); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		checkPlain("Exhaust(records)", llmretry.Exhaust(want))
		if a.log() != nil || b.log() != nil {
			t.Errorf("requests: a %v, b %v, want none", a.log(), b.log())
		}
	})
}
