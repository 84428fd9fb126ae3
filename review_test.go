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

// The tests in this file hold the breaker path to what a review of it
// found: each fails when its behaviour is broken, in virtual time where
// timing matters.

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

// The backends skipped for their breakers are revisited once: skipped
// again on that pass, they are not revisited a third time, and the call
// stops when the last of them fails.
func TestRevisitHappensOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		trunc := llmretry.Truncation("partial")
		brA, brB := &llmretry.Breaker{}, &llmretry.Breaker{}
		// Both half-open at 30s; opened by retry-after hints, which the
		// last backend's wait may wait out.
		tripFor(t, brA, 30*sec)
		tripFor(t, brB, 30*sec)
		a := newDesk("a", takes(0))
		b := newDesk("b", takes(sec, trunc))
		c := newDesk("c", takes(0, trunc))
		rec := newRecorder()
		ch := &chain{
			Backends: []backend{
				{Model: "a", Call: a.Call, Breaker: brA},
				{Model: "b", Call: b.Call, Breaker: brB},
				{Model: "c", Call: c.Call},
			},
			OnAttempt: rec.OnAttempt,
		}
		time.Sleep(sec)
		_, err := ch.Do(context.Background(), "hi")
		var tr *llmretry.Truncated
		if !errors.As(err, &tr) {
			t.Fatalf("Do() error = %v (%T), want a *Truncated", err, err)
		}
		const fo, stop = llmretry.NextFailOver, llmretry.NextStop
		at1 := start.Add(sec)
		want := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			skipRec(1, "b", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			{Backend: 2, Model: "c", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: at1, Next: fo, Why: llmretry.WhyNotRetryable},
			// The second pass: a is skipped again; b, the last, is waited
			// for, probed at 30s, and truncates too.
			skipRec(0, "a", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			waitRec(1, "b", 1, llmretry.KindTransient, at1, 29*sec, 29*sec),
			{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: start.Add(30 * sec), Elapsed: sec, Next: stop, Why: llmretry.WhyNotRetryable},
		}
		if diff := cmp.Diff(want, tr.Attempts, attemptOpts); diff != "" {
			t.Errorf("error's records (-want +got):\n%s", diff)
		}
		attempts, _ := rec.seen()
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("OnAttempt records (-want +got):\n%s", diff)
		}
		if got := a.log(); got != nil {
			t.Errorf("requests to a = %v, want none: no third pass", got)
		}
		if diff := cmp.Diff([]sent{{30 * sec, "hi"}}, b.log()); diff != "" {
			t.Errorf("requests to b (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{sec, "hi"}}, c.log()); diff != "" {
			t.Errorf("requests to c (-want +got):\n%s", diff)
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
