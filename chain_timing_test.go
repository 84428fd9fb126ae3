package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

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
			// A 60s reserve would leave nothing to retry in under a 30s deadline.
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

// A zero last wait is not repeated under a deadline: repeated, it would
// send requests back to back until the deadline.
func TestDoZeroLastWaitDoesNotRepeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		a := newFake("a", always(busy("busy")))
		c := &chain{Backends: []backend{{Model: "a", Call: a.Call, Retry: waits(10*ms, 0)}}}

		_, err := c.Do(ctx, "hi")
		if diff := cmpTimes([]time.Duration{0, 10 * ms, 10 * ms}, a.times()); diff != "" {
			t.Errorf("call times (-want +got):\n%s", diff)
		}
		if got := len(exhausted(t, err)); got != 3 {
			t.Errorf("records = %d, want 3", got)
		}
	})
}

func cmpTimes(want, got []time.Duration) string {
	if len(want) != len(got) {
		return "want " + durations(want) + "\ngot  " + durations(got)
	}
	for i := range want {
		if want[i] != got[i] {
			return "want " + durations(want) + "\ngot  " + durations(got)
		}
	}
	return ""
}

func durations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// On the real clock, the attempts' Start times fall between the moments
// before and after Do and follow one another: an attempt starts no earlier
// than the one before it ended. The real clock is checked because records
// must carry real times of day, not only differences; inside a synctest
// bubble time is fake. Start's wall clock is checked with a second of
// slack: time.Now reads the wall and monotonic clocks one after the other,
// and a preemption between the two shifts the wall reading by microseconds.
func TestDoStartsOnTheRealClock(t *testing.T) {
	busy := llmretry.StatusFailure(503, nil, nil)
	tests := []struct {
		name     string
		backends []backend
		want     int // attempts reported to OnAttempt
	}{
		{"first_try_answers", []backend{{Model: "a", Call: newFake("a", answers).Call}}, 1},
		{"all_fail", []backend{
			{Model: "a", Call: newFake("a", always(busy)).Call, Retry: llmretry.Policy{Waits: []time.Duration{0, 0}}},
			{Model: "b", Call: newFake("b", always(busy)).Call},
		}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			c := &chain{Backends: tc.backends, OnAttempt: rec.OnAttempt}
			before := time.Now()
			c.Do(context.Background(), "hi")
			after := time.Now()

			attempts, _ := rec.seen()
			if len(attempts) != tc.want {
				t.Fatalf("OnAttempt saw %d attempts, want %d", len(attempts), tc.want)
			}
			for i, a := range attempts {
				if a.Start.Before(before) || a.Start.After(after) {
					t.Errorf("attempt %d Start = %v, want between %v and %v", i+1, a.Start, before, after)
				}
				if wall := a.Start.Round(0); wall.Before(before.Add(-time.Second).Round(0)) || wall.After(after.Add(time.Second).Round(0)) {
					t.Errorf("attempt %d Start on the wall clock = %v, want within a second of %v to %v", i+1, wall, before, after)
				}
				if a.Elapsed < 0 || a.Start.Add(a.Elapsed).After(after) {
					t.Errorf("attempt %d Elapsed = %v from %v, want it to end by %v", i+1, a.Elapsed, a.Start, after)
				}
				if i > 0 {
					prev := attempts[i-1]
					if end := prev.Start.Add(prev.Elapsed); a.Start.Before(end) {
						t.Errorf("attempt %d Start = %v, want no earlier than %v, when attempt %d ended", i+1, a.Start, end, i)
					}
				}
			}
		})
	}
}
