package llmretry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/llmretry/llmretry"
)

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
