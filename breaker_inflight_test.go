package llmretry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

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
