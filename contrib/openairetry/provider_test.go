package openairetry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

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
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
			b := backend(m, newClient(srv), "gpt-4o", &deltas{})
			answer, _, err := run(t, b)
			if err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			var sent string
			switch raw := answer.Raw.(type) {
			case *openai.ChatCompletion:
				sent = raw.ID
			case *responses.Response:
				sent = raw.ID
			}
			if sent == "" {
				t.Fatalf("the answer's Raw (%T) has no id; the server sends one", answer.Raw)
			}
			want := info{Provider: "openai", Stream: m.streams(), ID: sent}
			got := info{Provider: b.Provider, Stream: b.Stream, ID: answer.ID}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("backend and answer (-want +got):\n%s", diff)
			}
		})
	}
}
