package openairetry_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A response the Responses API reports as failed is judged by its error
// code: a server error is retried, a rate limit too, a policy refuses the
// content, and any other code rejects the input. The Chat endpoint has no
// failed answers and sends the same code as an error event, or as the
// HTTP error it stands for, which maps the same way.
func TestFailedResponse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   string
		kind   llmretry.Kind
		status int
		next   llmretry.Next
		why    llmretry.Why
	}{
		{"server_error", llmretry.KindTransient, 500, llmretry.NextRetry, ""},
		{"rate_limit_exceeded", llmretry.KindTransient, 429, llmretry.NextRetry, ""},
		{"invalid_prompt", llmretry.KindRejected, 0, llmretry.NextFailOver, llmretry.WhyNotRetryable},
		{"bio_policy", llmretry.KindRefused, 0, llmretry.NextStop, llmretry.WhyRefused},
	}
	for _, m := range []mode{respPlain, respStream} {
		for _, tc := range tests {
			t.Run(m.String()+"/"+tc.code, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", llmretrytest.Failed(tc.code), llmretrytest.Answer("ok"))
				srv.Script("gpt-b", llmretrytest.Answer("ok"))
				client := newClient(srv)
				a := backend(m, client, "gpt-a", &deltas{})
				a.Retry = waits(1)

				_, attempts, _ := run(t, a, backend(m, client, "gpt-b", &deltas{}))
				want := []row{{Model: "gpt-a", Try: 1, Step: "failed " + tc.code, Kind: tc.kind, Status: tc.status, Next: tc.next, Why: tc.why}}
				switch tc.next {
				case llmretry.NextRetry:
					want[0].RetryIn = short
					want = append(want, answered(m, "gpt-a", 2))
				case llmretry.NextFailOver:
					want = append(want, answered(m, "gpt-b", 1))
				}
				if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if len(attempts) > 0 {
					if msg, want := fmt.Sprint(attempts[0].Err), "response failed (code "+tc.code; !strings.Contains(msg, want) {
						t.Errorf("record's error = %q, want it to contain %q", msg, want)
					}
				}
			})
		}
	}
}
