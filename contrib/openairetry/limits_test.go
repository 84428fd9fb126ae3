package openairetry_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// limits is the bucket the tests put the model behind: 5 requests, 2
// more a second.
var limits = llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 2, Burst: 5}}

// Every response's rate-limit headers reach the backend's Breaker, in
// both modes: an answer's, an error response's, and a 200 stream's that
// then fails with an error event. After one request of a full bucket of
// 5, the Breaker knows 4 remain and when the provider admits the next.
func TestLimitsReachBreaker(t *testing.T) {
	tests := []struct {
		name  string
		modes []mode
		step  llmretrytest.Step
	}{
		{"answer", modes, llmretrytest.Answer("Rayleigh scattering.")},
		{"error response", modes, llmretrytest.Status(500)},
		{"error event", []mode{stream, respStream}, llmretrytest.StreamError("server_error")},
	}
	for _, tc := range tests {
		for _, m := range tc.modes {
			t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
				srv := newServer(t)
				srv.Script("gpt-4o", tc.step)
				srv.Limit("gpt-4o", limits)
				b := backend(m, newClient(srv), "gpt-4o", &deltas{})
				b.Breaker = &llmretry.Breaker{}
				_, _, _ = run(t, b)

				st := b.Breaker.State()
				if st.Reported.IsZero() || st.Remaining != 4 || st.NextAdmission.IsZero() {
					t.Errorf("Breaker.State() = %+v, want a report of 4 remaining with a next admission", st)
				}
			})
		}
	}
}

// A burst of concurrent calls larger than the bucket, through the real
// client and a Breaker that paces by the headers the backend reports,
// draws no 429: every call is answered, and every request the chain sent
// is in the server's log. The 21 requests take some 8 s of real time
// (16 past the bucket's 5, at 2 a second); the test counts, and asserts
// no timing.
//
// One call goes first, alone: a Breaker does not pace before its first
// report, so a cold burst would meet the bucket unpaced.
func TestLimitsPaceBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("takes some 8 s of real time")
	}
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-4o", llmretrytest.Answer("Rayleigh scattering."))
			srv.Limit("gpt-4o", limits)
			b := backend(m, newClient(srv), "gpt-4o", &deltas{})
			b.Breaker = &llmretry.Breaker{}
			var (
				mu   sync.Mutex
				sent int // attempts that sent a request, skipped ones left out
			)
			chain := &llmretry.Chain[string, llmretry.Completion]{
				Backends: []llmretry.Backend[string, llmretry.Completion]{b},
				OnAttempt: func(_ context.Context, a llmretry.Attempt) {
					if !a.Skipped {
						mu.Lock()
						sent++
						mu.Unlock()
					}
				},
			}
			if _, err := chain.Do(t.Context(), "first"); err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			const burst = 20
			errs := make([]error, burst)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { _, errs[i] = chain.Do(t.Context(), "burst") })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Errorf("Do() = %v, want every call answered", err)
			}

			log := srv.Requests()
			refused := 0
			for _, r := range log {
				if r.Step != "answer" {
					refused++
				}
			}
			if refused != 0 {
				t.Errorf("server log: %d of %d requests not answered, want 0", refused, len(log))
			}
			if len(log) != sent || sent != burst+1 {
				t.Errorf("server logged %d requests, the chain sent %d; want %d each", len(log), sent, burst+1)
			}
		})
	}
}
