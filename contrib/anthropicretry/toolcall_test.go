package anthropicretry_test

import (
	"encoding/json"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A tool call is an answer, in every mode, as the SDK reads the scripted
// server's: no text, the tool_use block in Raw, its cost in the record.
func TestToolCallAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.ToolCall("get_weather", `{"city": "Paris"}`))
			var emitted []string
			answer, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", llmretry.Policy{}, &emitted))
			if err != nil {
				t.Fatalf("Do() = %v, want the tool call", err)
			}
			msg, ok := answer.Raw.(*anthropic.Message)
			if !ok {
				t.Fatalf("Completion.Raw = %T, want *anthropic.Message", answer.Raw)
			}
			var input map[string]string
			if len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" || msg.Content[0].Name != "get_weather" ||
				json.Unmarshal(msg.Content[0].Input, &input) != nil || input["city"] != "Paris" {
				t.Errorf("content = %+v, want one tool_use of get_weather with city Paris", msg.Content)
			}
			if answer.Text != "" || answer.StopReason != "tool_use" || len(emitted) != 0 || records[0].Delivered {
				t.Errorf("text %q, stop %q, emitted %q, delivered %v; want no text, stop tool_use", answer.Text, answer.StopReason, emitted, records[0].Delivered)
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 2}, records[0].Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
		})
	}
}
