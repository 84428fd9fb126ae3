package openairetry_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// refusalText is what the model wrote when it refused.
const refusalText = "I can't help with that."

// refusalBodies are a model's refusal as each mode reads it: a message's
// refusal field, and a response's refusal part, in JSON and in a stream.
// The scripted server has no such answer; these are raw.
var refusalBodies = map[mode]string{
	plain: `{"id":"c1","object":"chat.completion","created":0,"model":"gpt-a","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":6,"total_tokens":16}}`,
	stream: refusalChunk(`{"role":"assistant","refusal":""}`, "null") + refusalChunk(`{"refusal":"I can't "}`, "null") +
		refusalChunk(`{"refusal":"help with that."}`, "null") + refusalChunk(`{}`, `"stop"`) +
		`data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"gpt-a","choices":[],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":6,"total_tokens":16}}` + "\n\ndata: [DONE]\n\n",
	respPlain: refusalResponse,
	respStream: "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":" +
		`{"id":"r1","object":"response","created_at":0,"model":"gpt-a","status":"in_progress","output":[]}}` + "\n\n" +
		"event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"sequence_number\":1,\"item_id\":\"m1\",\"output_index\":0,\"content_index\":0,\"delta\":\"I can't \"}\n\n" +
		"event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"sequence_number\":2,\"item_id\":\"m1\",\"output_index\":0,\"content_index\":0,\"delta\":\"help with that.\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":" + refusalResponse + "}\n\n",
}

// refusalResponse is a completed response whose one message refuses.
const refusalResponse = `{"id":"r1","object":"response","created_at":0,"model":"gpt-a","status":"completed","error":null,"incomplete_details":null,` +
	`"output":[{"type":"message","id":"m1","status":"completed","role":"assistant","content":[{"type":"refusal","refusal":"I can't help with that."}]}],` +
	`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16}}`

// refusalChunk is one Chat Completions stream chunk with delta and finish.
func refusalChunk(delta, finish string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"gpt-a","choices":[{"index":0,"delta":` +
		delta + `,"logprobs":null,"finish_reason":` + finish + `}]}` + "\n\n"
}

// A model that refuses answers with no text: the attempt is an empty
// answer, retried, and its record keeps the refusal's text, in every
// mode, Responses as Chat.
func TestModelRefusalKept(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			body := refusalBodies[m]
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(body, "{") {
					w.Header().Set("Content-Type", "application/json")
				} else {
					w.Header().Set("Content-Type", "text/event-stream")
				}
				w.Write([]byte(body))
			}))
			defer srv.Close()
			client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(testKey))
			var a llmretry.Backend[string, llmretry.Completion]
			switch m {
			case plain:
				a = openairetry.Chat(client, "gpt-a", build)
			case stream:
				a = openairetry.ChatStream(client, "gpt-a", build, (&deltas{}).emit)
			case respPlain:
				a = openairetry.Responses(client, "gpt-a", buildResponses)
			case respStream:
				a = openairetry.ResponsesStream(client, "gpt-a", buildResponses, (&deltas{}).emit)
			}
			_, attempts, err := run(t, a)
			if err == nil || len(attempts) != 1 {
				t.Fatalf("Do() = %v after %d attempts, want one failed attempt", err, len(attempts))
			}
			got := attempts[0]
			if got.Kind != llmretry.KindParse || got.RawText == nil || *got.RawText != refusalText {
				t.Errorf("record kind %v, raw text %v; want parse with the refusal %q", got.Kind, rawOf(got), refusalText)
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 6}, got.Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
		})
	}
}

// rawOf is a record's raw text as a test message shows it.
func rawOf(a llmretry.Attempt) any {
	if a.RawText == nil {
		return nil
	}
	return *a.RawText
}
