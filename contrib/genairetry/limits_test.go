package genairetry_test

import (
	"net/http"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The Gemini API sends no rate-limit headers, but a gateway in front of
// it may: every response's headers reach the backend's Breaker, an
// answer's through the SDK, an error response's through the Transport.
func TestLimitsReachBreaker(t *testing.T) {
	t.Parallel()
	limited := func(st llmretrytest.Step) llmretrytest.Step {
		return st.WithHeader("X-Ratelimit-Limit-Requests", "5").
			WithHeader("X-Ratelimit-Remaining-Requests", "4").
			WithHeader("X-Ratelimit-Reset-Requests", "500ms")
	}
	tests := []struct {
		name string
		step llmretrytest.Step
		rt   http.RoundTripper
	}{
		{"answer", limited(llmretrytest.Answer("Hello.")), genairetry.Transport(nil)},
		{"answer_without_transport", limited(llmretrytest.Answer("Hello.")), http.DefaultTransport},
		{"error_response", limited(llmretrytest.Status(500)), genairetry.Transport(nil)},
		{"error_in_stream", limited(llmretrytest.StreamError("INTERNAL")), genairetry.Transport(nil)},
	}
	for _, tc := range tests {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gemini", tc.step)
				b := m.backend(clientAt(t, srv.GeminiBaseURL(), tc.rt), "gemini", llmretry.Policy{}, nil)
				b.Breaker = &llmretry.Breaker{}
				_, _, _ = run(t.Context(), b)

				st := b.Breaker.State()
				if st.Reported.IsZero() || st.Remaining != 4 || st.NextAdmission.IsZero() {
					t.Errorf("Breaker.State() = %+v, want a report of 4 remaining with a next admission", st)
				}
			})
		}
	}
}
