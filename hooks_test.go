package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// hookKey marks the contexts the hooks under test hand on.
type hookKey struct{}

// TestHooksOrder checks that WrapDo runs around the whole call, that
// OnAttemptStart comes before each request sent and not before a skip,
// and that the context each returns reaches the Call, OnAttempt and the
// next hook, under a Timeout and StallTimeout too.
func TestHooksOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var events []string
		br := &llmretry.Breaker{Failures: 1}
		br503 := newFake("a", func(ctx context.Context, n int) error { return llmretry.StatusFailure(503, nil, errors.New("down")) })
		// Open the breaker of backend 0 with a first, uninstrumented call.
		warm := &chain{Backends: []backend{{Model: "a", Call: br503.Call, Breaker: br}, {Model: "b", Call: okCall}}}
		if _, err := warm.Do(context.Background(), "x"); err != nil {
			t.Fatalf("warm Do() = %v, want nil", err)
		}
		seen := func(where string, ctx context.Context) string {
			v, _ := ctx.Value(hookKey{}).(string)
			return where + "[" + v + "]"
		}
		c := &chain{
			Backends: []backend{
				{Model: "a", Call: br503.Call, Breaker: br},
				{Model: "b", Timeout: time.Second, StallTimeout: time.Second, Retry: llmretry.Policy{Waits: []time.Duration{ms}},
					Call: func(ctx context.Context, req string) (string, error) {
						events = append(events, seen("call", ctx))
						if len(events) < 5 {
							return "", llmretry.StatusFailure(500, nil, errors.New("boom"))
						}
						return "ok", nil
					}},
			},
			WrapDo: func(ctx context.Context, do func(context.Context) (string, error)) (string, error) {
				events = append(events, "wrap")
				resp, err := do(context.WithValue(ctx, hookKey{}, "do"))
				events = append(events, fmt.Sprintf("wrapped %q %v", resp, err))
				return resp + "!", err
			},
			OnAttemptStart: func(ctx context.Context, bi int, model string, try int) context.Context {
				events = append(events, seen(fmt.Sprintf("start %d %s %d", bi, model, try), ctx))
				return context.WithValue(ctx, hookKey{}, "attempt")
			},
			OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
				events = append(events, seen(fmt.Sprintf("end %d %d skipped=%v next=%q", a.Backend, a.Try, a.Skipped, a.Next), ctx))
			},
		}
		got, err := c.Do(context.Background(), "x")
		if err != nil || got != "ok!" {
			t.Fatalf("Do() = %q, %v, want \"ok!\", nil", got, err)
		}
		want := []string{
			"wrap",
			`end 0 1 skipped=true next="fail_over"[do]`,
			"start 1 b 1[do]",
			"call[attempt]",
			`end 1 1 skipped=false next="retry"[do]`,
			"start 1 b 2[do]",
			"call[attempt]",
			`end 1 2 skipped=false next=""[do]`,
			`wrapped "ok" <nil>`,
		}
		if diff := cmp.Diff(want, events); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})
}

// okCall answers every request.
func okCall(ctx context.Context, req string) (string, error) { return "ok", nil }

// TestOnAttemptStartKeepsMark checks that the attempt's mark sits above
// the hook's context, so Delivered still marks the attempt, and that a nil
// context from the hook means the call's own.
func TestOnAttemptStartKeepsMark(t *testing.T) {
	tests := []struct {
		name string
		hook func(ctx context.Context, bi int, model string, try int) context.Context
		want string
	}{
		{"value", func(ctx context.Context, bi int, model string, try int) context.Context {
			return context.WithValue(ctx, hookKey{}, "attempt")
		}, "attempt"},
		{"nil", func(ctx context.Context, bi int, model string, try int) context.Context { return nil }, "caller"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got string
			c := &chain{
				Backends: []backend{{Model: "a", Retry: llmretry.Policy{Waits: []time.Duration{0}}, Call: func(ctx context.Context, req string) (string, error) {
					got, _ = ctx.Value(hookKey{}).(string)
					llmretry.Delivered(ctx)
					return "", llmretry.StatusFailure(500, nil, errors.New("boom"))
				}}},
				OnAttemptStart: tc.hook,
			}
			_, err := c.Do(context.WithValue(context.Background(), hookKey{}, "caller"), "x")
			var ex *llmretry.Exhausted
			if !errors.As(err, &ex) {
				t.Fatalf("Do() = %v, want an *Exhausted", err)
			}
			if a := ex.Attempts[len(ex.Attempts)-1]; !a.Delivered || a.Why != llmretry.WhyDelivered || len(ex.Attempts) != 1 {
				t.Errorf("attempts = %v, want one, delivered, stopped for it", ex.Attempts)
			}
			if got != tc.want {
				t.Errorf("Call's context value = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestWrapDoSeesConfigError checks that WrapDo runs for a chain set up
// wrong and sees its error.
func TestWrapDoSeesConfigError(t *testing.T) {
	var seen error
	c := &chain{WrapDo: func(ctx context.Context, do func(context.Context) (string, error)) (string, error) {
		resp, err := do(ctx)
		seen = err
		return resp, err
	}}
	_, err := c.Do(context.Background(), "x")
	if !errors.Is(err, llmretry.ErrConfig) || seen != err {
		t.Errorf("Do() = %v, WrapDo saw %v, want the same ErrConfig error", err, seen)
	}
}
