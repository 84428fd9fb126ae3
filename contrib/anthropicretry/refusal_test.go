package anthropicretry_test

import (
	"errors"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// stop_reason refusal is the model refusing the content. By default the
// chain ends on it rather than show the content to another provider;
// Chain.FailOverRefused sends it on. Text the caller already holds keeps
// the chain from going on either way.
func TestRefusal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		text     string // what the model wrote before it refused
		failOver bool
	}{
		{"stops", "", false},
		{"stops_with_text", "I can't", false},
		{"fails_over", "", true},
		{"fails_over_with_text", "I can't", true},
	}
	for _, m := range modes {
		for _, tc := range tests {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("claude-a", llmretrytest.Refuse(tc.text))
				srv.Script("claude-b", llmretrytest.Answer("from b"))
				client := newClient(srv)
				chain := &llmretry.Chain[string, llmretry.Completion]{FailOverRefused: tc.failOver}
				answer, records, err := runChain(t.Context(), chain,
					m.backend(client, "claude-a", tiny, nil),
					m.backend(client, "claude-b", tiny, nil))

				delivered := m.delivers() && tc.text != ""
				wantNext, wantWhy := llmretry.NextStop, llmretry.WhyRefused
				switch {
				case delivered:
					wantWhy = llmretry.WhyDelivered
				case tc.failOver:
					wantNext, wantWhy = llmretry.NextFailOver, llmretry.WhyNotRetryable
				}
				if wantNext == llmretry.NextFailOver {
					if err != nil || answer.Text != "from b" {
						t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
					}
					checkKinds(t, records, "claude-a refused", "claude-b ok")
				} else {
					if !errors.As(err, new(*llmretry.Exhausted)) {
						t.Fatalf("Do() = %q, %v; want an *llmretry.Exhausted", answer.Text, err)
					}
					if llmretry.RetryItem(err) {
						t.Errorf("RetryItem(%v) = true, want false: the same content is refused again", err)
					}
					checkKinds(t, records, "claude-a refused")
				}
				a := records[0]
				if a.Next != wantNext || a.Why != wantWhy {
					t.Errorf("refused record's Next, Why = %q, %q; want %q, %q", a.Next, a.Why, wantNext, wantWhy)
				}
				if got, want := a.Err.Error(), "refused: stop_reason refusal"; got != want {
					t.Errorf("refused record's error = %q, want %q", got, want)
				}
				if tc.text != "" && (a.RawText == nil || *a.RawText != tc.text) {
					t.Errorf("refused record's RawText = %v, want %q", a.RawText, tc.text)
				}
				matchLog(t, records, err, srv)
			})
		}
	}
}
