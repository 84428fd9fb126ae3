package llmretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

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
	if st := br.State(); !st.Open || time.Until(st.Until) != d {
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
