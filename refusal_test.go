package llmretry_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// A refusal ends the chain with the provider's reason by default, fails
// over only when the chain asks for it, is never retried, and never
// counts against the backend's Breaker.
func TestRefusal(t *testing.T) {
	refusal := func() error {
		f := llmretry.Refusal("finish_reason content_filter")
		raw := "I can"
		f.RawText = &raw
		return f
	}
	tests := []struct {
		name      string
		failOver  bool
		wantNext  llmretry.Next
		wantWhy   llmretry.Why
		wantCalls int // calls to the second backend
		wantErr   bool
	}{
		{name: "stops_by_default", wantNext: llmretry.NextStop, wantWhy: llmretry.WhyRefused, wantErr: true},
		{name: "fails_over_when_asked", failOver: true, wantNext: llmretry.NextFailOver, wantWhy: llmretry.WhyNotRetryable, wantCalls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				br := &llmretry.Breaker{Failures: 1}
				a, b := newFake("a", func(context.Context, int) error { return refusal() }), newFake("b", answers)
				rec := newRecorder()
				c := &chain{
					Backends: []backend{
						{Model: "a", Call: a.Call, Retry: waits(time.Second, time.Second), Breaker: br},
						{Model: "b", Call: b.Call},
					},
					OnAttempt:       rec.OnAttempt,
					FailOverRefused: tc.failOver,
				}
				_, err := c.Do(context.Background(), "hi")
				if (err != nil) != tc.wantErr {
					t.Fatalf("Do() error = %v, want error %v", err, tc.wantErr)
				}
				if got := len(a.times()); got != 1 {
					t.Errorf("refusing backend called %d times, want 1: a refusal is not retried", got)
				}
				if got := len(b.times()); got != tc.wantCalls {
					t.Errorf("second backend called %d times, want %d", got, tc.wantCalls)
				}
				seen, _ := rec.seen()
				first := seen[0]
				want := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindRefused, Next: tc.wantNext, Why: tc.wantWhy}
				got := llmretry.Attempt{Model: first.Model, Try: first.Try, Kind: first.Kind, Next: first.Next, Why: first.Why}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("first record differs (-want +got):\n%s", d)
				}
				if first.RawText == nil || *first.RawText != "I can" {
					t.Errorf("RawText = %v, want the partial answer kept", first.RawText)
				}
				if st := br.State(); st.Open {
					t.Errorf("breaker open after a refusal (Failures 1): %+v; a refusal says nothing of the backend's health", st)
				}
				if !tc.wantErr {
					return
				}
				var ex *llmretry.Exhausted
				if !errors.As(err, &ex) {
					t.Fatalf("Do() error = %T, want *Exhausted", err)
				}
				if llmretry.RetryItem(err) {
					t.Errorf("RetryItem = true, want false: the same content is refused again")
				}
				msg := err.Error()
				for _, want := range []string{"the provider refused the content", "content_filter"} {
					if !strings.Contains(msg, want) {
						t.Errorf("Error() = %q, want it to contain %q", msg, want)
					}
				}
			})
		})
	}
}

// Every backend refusing, with fail-over asked for, still advises not
// to run the item again.
func TestRefusalEverywhere(t *testing.T) {
	ref := func(context.Context, int) error { return llmretry.Refusal("stop_reason refusal") }
	c := &chain{
		Backends:        []backend{{Model: "a", Call: newFake("a", ref).Call}, {Model: "b", Call: newFake("b", ref).Call}},
		FailOverRefused: true,
	}
	_, err := c.Do(context.Background(), "hi")
	if err == nil || llmretry.RetryItem(err) {
		t.Fatalf("Do() = %v, RetryItem %v; want an error that advises false", err, llmretry.RetryItem(err))
	}
	if !strings.Contains(err.Error(), "the provider refused the content") {
		t.Errorf("Error() = %q, want the refusal lever", err)
	}
	if got := llmretry.Classify(llmretry.Refusal("x")); got != llmretry.KindRefused {
		t.Errorf("Classify(Refusal) = %v, want refused", got)
	}
	if got := llmretry.KindRefused.String(); got != "refused" {
		t.Errorf("KindRefused.String() = %q, want refused", got)
	}
	if llmretry.KindRefused.Retryable() {
		t.Errorf("KindRefused.Retryable() = true, want false")
	}
}

// The summary's lever follows the advice: nothing retryable was seen, so
// it never suggests wider waits; a rejected 429 is a spent quota.
func TestLeverOfRequestRefusals(t *testing.T) {
	at := time.Unix(0, 0).UTC()
	refused := llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindRefused, Start: at, Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable}
	rejected := llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindRejected, Status: 400, Start: at, Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable}
	quota := rejected
	quota.Status = 429
	tests := []struct {
		attempts []llmretry.Attempt
		want     string
	}{
		{[]llmretry.Attempt{refused, rejected}, "change the request"},
		{[]llmretry.Attempt{rejected, quota}, "a spent quota among them"},
	}
	for _, tc := range tests {
		err := &llmretry.Exhausted{Attempts: tc.attempts}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "widen the retry waits") {
			t.Errorf("Error() = %q, want the lever %q", msg, tc.want)
		}
		if err.ItemRetryable() {
			t.Errorf("ItemRetryable() = true for %v, want false", tc.attempts)
		}
	}
}
