package genairetry_test

import (
	"net/http"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The Gemini API sends no rate-limit headers, but a gateway in front of
// it may. The conformance suite checks that an answer's, an error
// response's and a failed stream's reach the backend's Breaker with the
// package's Transport; without it, an answer's still do, through the SDK.
func TestLimitsReachBreakerWithoutTransport(t *testing.T) {
	t.Parallel()
	step := llmretrytest.Answer("Hello.").
		WithHeader("X-Ratelimit-Limit-Requests", "5").
		WithHeader("X-Ratelimit-Remaining-Requests", "4").
		WithHeader("X-Ratelimit-Reset-Requests", "500ms")
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini", step)
			b := m.backend(clientAt(t, srv.GeminiBaseURL(), http.DefaultTransport), "gemini", llmretry.Policy{}, nil)
			b.Breaker = &llmretry.Breaker{}
			_, _, _ = run(t.Context(), b)

			st := b.Breaker.State()
			if st.Reported.IsZero() || st.Remaining != 4 || st.NextAdmission.IsZero() {
				t.Errorf("Breaker.State() = %+v, want a report of 4 remaining with a next admission", st)
			}
		})
	}
}
