package genairetry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genai"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
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
			srv.Script("gemini-a", llmretrytest.Answer("Hello."))
			b := m.backend(newClient(t, srv), "gemini-a", llmretry.Policy{}, nil)
			answer, _, err := run(t.Context(), b)
			if err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			resp, _ := answer.Raw.(*genai.GenerateContentResponse)
			if resp == nil || resp.ResponseID == "" {
				t.Fatalf("the answer's Raw (%T) has no responseId; the server sends one", answer.Raw)
			}
			want := info{Provider: "gcp.gemini", Stream: m.stream, ID: resp.ResponseID}
			got := info{Provider: b.Provider, Stream: b.Stream, ID: answer.ID}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("backend and answer (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVertexProvider checks that a client built for Vertex AI names that
// provider, not the Gemini API's.
func TestVertexProvider(t *testing.T) {
	client, err := genai.NewClient(t.Context(), &genai.ClientConfig{Backend: genai.BackendVertexAI, APIKey: fakeKey})
	if err != nil {
		t.Fatalf("genai.NewClient() = %v", err)
	}
	for name, b := range map[string]llmretry.Backend[string, llmretry.Completion]{
		"GenerateContent":       genairetry.GenerateContent(client, "gemini-a", build),
		"GenerateContentStream": genairetry.GenerateContentStream(client, "gemini-a", build, nil),
	} {
		if b.Provider != "gcp.vertex_ai" {
			t.Errorf("%s(vertex client).Provider = %q, want %q", name, b.Provider, "gcp.vertex_ai")
		}
	}
}
