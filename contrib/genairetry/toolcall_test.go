package genairetry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
	"google.golang.org/genai"
)

// A function call is an answer, in every mode, as the SDK reads the
// scripted server's: no text, the call in Raw, its cost in the record.
func TestToolCallAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.ToolCall("get_weather", `{"city": "Paris"}`))
			var emitted []string
			answer, records, err := run(t.Context(), m.backend(newClient(t, srv), "gemini-a", tiny, &emitted))
			if err != nil {
				t.Fatalf("Do() = %v, want the function call", err)
			}
			resp, ok := answer.Raw.(*genai.GenerateContentResponse)
			if !ok {
				t.Fatalf("Completion.Raw = %T, want *genai.GenerateContentResponse", answer.Raw)
			}
			calls := resp.FunctionCalls()
			if len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].Args["city"] != "Paris" {
				t.Errorf("function calls = %+v, want get_weather with city Paris", calls)
			}
			if answer.Text != "" || len(emitted) != 0 || records[0].Delivered {
				t.Errorf("text %q, emitted %q, delivered %v; want no text", answer.Text, emitted, records[0].Delivered)
			}
			checkKinds(t, records, "gemini-a ok")
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 2}, records[0].Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
		})
	}
}
