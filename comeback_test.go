package llmretry_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/llmretry/llmretry"
)

// TestComeBackAfterHealthFailure holds Do to doc.go's promise that "a call
// that skipped a backend comes back to it, as the last it can try, when
// every backend after it failed for a reason about the request". Here c is
// skipped and the only backend after it, d, is rejected, so the call must
// come back to c; that b, before c, failed for its health must not matter.
// The property test (TestChainMatchesModel) found the case.
func TestComeBackAfterHealthFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent := map[string]int{}
		script := func(name string, codes ...int) func(context.Context, string) (string, error) {
			return func(context.Context, string) (string, error) {
				i := sent[name]
				sent[name]++
				if i < len(codes) {
					h := http.Header{}
					if codes[i] == 503 {
						h.Set("Retry-After", "60") // opens the breaker for a minute
					}
					return "", llmretry.StatusFailure(codes[i], h, nil)
				}
				return name, nil
			}
		}
		chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
			{Model: "a", Call: script("a", 503), Breaker: &llmretry.Breaker{}},
			{Model: "b", Call: script("b", 400, 500)},
			{Model: "c", Call: script("c", 503), Breaker: &llmretry.Breaker{}},
			{Model: "d", Call: script("d", 400, 400)},
		}}
		// The first call opens a's and c's breakers.
		if _, err := chain.Do(context.Background(), "req"); err == nil {
			t.Fatalf("first Do() = nil error, want every backend failed")
		}
		// The second skips a and c; b fails for its health, d for the
		// request: c, after which only d failed, is come back to once its
		// breaker half-opens.
		got, err := chain.Do(context.Background(), "req")
		if got != "c" || err != nil {
			t.Errorf("second Do() = %q, %v, want \"c\", nil", got, err)
		}
	})
}
