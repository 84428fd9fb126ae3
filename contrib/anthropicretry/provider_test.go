package anthropicretry_test

import (
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// TestBackendTelemetry checks what each constructor tells telemetry: the
// Backend's provider by the GenAI conventions' name and whether it
// streams, and the answer's id as the server sent it.
func TestBackendTelemetry(t *testing.T) {
	type info struct {
		Provider string
		Stream   bool
		ID       string
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-x", llmretrytest.Answer("Hello."))
			b := m.backend(newClient(srv), "claude-x", llmretry.Policy{}, nil)
			answer, _, err := run(t.Context(), b)
			if err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			msg, _ := answer.Raw.(*anthropic.Message)
			if msg == nil || msg.ID == "" {
				t.Fatalf("the answer's Raw (%T) has no id; the server sends one", answer.Raw)
			}
			want := info{Provider: "anthropic", Stream: m.stream, ID: msg.ID}
			got := info{Provider: b.Provider, Stream: b.Stream, ID: answer.ID}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("backend and answer (-want +got):\n%s", diff)
			}
		})
	}
}
