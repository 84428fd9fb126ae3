package llmretrytest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The JSON answers, field for field as the SDKs decode them.
func TestJSONAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		api  string
		step Step
		want string // CREATED stands for the created time
	}{
		{"openai_answer", "openai", Answer("Hi there"), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Hi there","refusal":null},"logprobs":null,"finish_reason":"stop"}],
			"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`},
		{"openai_truncated", "openai", Truncated("Once upon a"), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Once upon a","refusal":null},"logprobs":null,"finish_reason":"length"}],
			"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}`},
		{"openai_empty", "openai", Answer(""), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":"stop"}],
			"usage":{"prompt_tokens":10,"completion_tokens":0,"total_tokens":10}}`},
		{"openai_unfinished", "openai", StreamUnfinished(2), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":"chunk1 chunk2 ","refusal":null},"logprobs":null,"finish_reason":null}],
			"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`},
		{"anthropic_answer", "anthropic", Answer("Hi there"), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[{"type":"text","text":"Hi there"}],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":2}}`},
		{"anthropic_truncated", "anthropic", Truncated("Once upon a"), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[{"type":"text","text":"Once upon a"}],"stop_reason":"max_tokens","stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":3}}`},
		{"openai_refused", "openai", Refuse("I can"), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":"I can","refusal":null},"logprobs":null,"finish_reason":"content_filter"}],
			"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`},
		{"anthropic_refused", "anthropic", Refuse("I can"), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[{"type":"text","text":"I can"}],"stop_reason":"refusal","stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":2}}`},
		{"anthropic_empty", "anthropic", Answer(""), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[],"stop_reason":"end_turn","stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":0}}`},
		{"anthropic_unfinished", "anthropic", StreamUnfinished(1), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[{"type":"text","text":"chunk1 "}],"stop_reason":null,"stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":1}}`},
		{"openai_tool_call", "openai", ToolCall("get_weather", `{"city": "Paris"}`), `{"id":"chatcmpl-m-1","object":"chat.completion","created":CREATED,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,
				"tool_calls":[{"id":"call_m_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
				"logprobs":null,"finish_reason":"tool_calls"}],
			"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`},
		{"anthropic_tool_call", "anthropic", ToolCall("get_weather", `{"city": "Paris"}`), `{"id":"msg_m_1","type":"message","role":"assistant","model":"m",
			"content":[{"type":"tool_use","id":"toolu_m_1","name":"get_weather","input":{"city":"Paris"}}],"stop_reason":"tool_use","stop_sequence":null,
			"usage":{"input_tokens":10,"output_tokens":2}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			got := call(t, newClient(t), s, tc.api, "m", false)
			if got.err != nil {
				t.Fatalf("request: %v", got.err)
			}
			if got.resp.StatusCode != http.StatusOK {
				t.Errorf("status = %d, want 200", got.resp.StatusCode)
			}
			if ct := got.resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content-type = %q, want application/json", ct)
			}
			idHeader := map[string]string{"openai": "X-Request-Id", "anthropic": "Request-Id"}[tc.api]
			if id := got.resp.Header.Get(idHeader); id != "req_m_1" {
				t.Errorf("%s = %q, want req_m_1", idHeader, id)
			}
			created := strconv.FormatInt(s.Requests()[0].Time.Unix(), 10)
			want := decode(t, []byte(strings.ReplaceAll(tc.want, "CREATED", created)))
			if diff := cmp.Diff(want, decode(t, got.body)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// The streams, event for event, with the framing and the ends the SDKs
// look for.
func TestStreams(t *testing.T) {
	t.Parallel()
	// OpenAI chunks differ only in their choices (and usage), so the test
	// names those; CREATED stands for the created time.
	oaChunk := func(choice string) string {
		return `{"id":"chatcmpl-m-1","object":"chat.completion.chunk","created":CREATED,"model":"m","choices":[` + choice + `]}`
	}
	oaRole := oaChunk(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`)
	oaText := func(text string) string {
		return oaChunk(`{"index":0,"delta":{"content":"` + text + `"},"logprobs":null,"finish_reason":null}`)
	}
	oaFinish := func(reason string) string {
		return oaChunk(`{"index":0,"delta":{},"logprobs":null,"finish_reason":"` + reason + `"}`)
	}
	oaUsage := func(out int) string {
		return fmt.Sprintf(`{"id":"chatcmpl-m-1","object":"chat.completion.chunk","created":CREATED,"model":"m","choices":[],
			"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, out, 10+out)
	}
	anStart := `{"type":"message_start","message":{"id":"msg_m_1","type":"message","role":"assistant","model":"m","content":[],
		"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`
	anPing := `{"type":"ping"}`
	anBlock := `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	anText := func(text string) string {
		return `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}`
	}
	anBlockStop := `{"type":"content_block_stop","index":0}`
	anDelta := func(reason string, out int) string {
		return fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"%s","stop_sequence":null},"usage":{"output_tokens":%d}}`, reason, out)
	}
	anStop := `{"type":"message_stop"}`

	type ev struct{ name, data string }
	tests := []struct {
		name    string
		api     string
		body    string // the request; "" means requestBody(api, "m", true)
		step    Step
		want    []ev
		wantErr error // of reading the body
	}{
		{name: "openai_answer", api: "openai", step: Answer("Hi there"), want: []ev{
			{"", oaRole}, {"", oaText("Hi ")}, {"", oaText("there")}, {"", oaFinish("stop")}, {"", oaUsage(2)}, {"", "[DONE]"}}},
		{name: "openai_answer_without_usage", api: "openai", body: `{"model":"m","stream":true}`, step: Answer("Hi"), want: []ev{
			{"", oaRole}, {"", oaText("Hi")}, {"", oaFinish("stop")}, {"", "[DONE]"}}},
		{name: "openai_truncated", api: "openai", step: Truncated("Once upon"), want: []ev{
			{"", oaRole}, {"", oaText("Once ")}, {"", oaText("upon")}, {"", oaFinish("length")}, {"", oaUsage(2)}, {"", "[DONE]"}}},
		{name: "openai_refused", api: "openai", step: Refuse("No"), want: []ev{
			{"", oaRole}, {"", oaText("No")}, {"", oaFinish("content_filter")}, {"", oaUsage(1)}, {"", "[DONE]"}}},
		{name: "openai_empty", api: "openai", step: Answer(""), want: []ev{
			{"", oaRole}, {"", oaFinish("stop")}, {"", oaUsage(0)}, {"", "[DONE]"}}},
		{name: "openai_stream_error", api: "openai", step: StreamError("server_error"), want: []ev{
			{"", oaRole}, {"", `{"error":{"message":"The server had an error while processing your request: server_error.","type":"server_error","param":null,"code":null}}`}}},
		{name: "openai_drop", api: "openai", step: StreamDrop(2), wantErr: io.ErrUnexpectedEOF, want: []ev{
			{"", oaRole}, {"", oaText("chunk1 ")}, {"", oaText("chunk2 ")}}},
		{name: "openai_drop_0", api: "openai", step: StreamDrop(0), wantErr: io.ErrUnexpectedEOF, want: []ev{{"", oaRole}}},
		{name: "openai_unfinished", api: "openai", step: StreamUnfinished(1), want: []ev{
			{"", oaRole}, {"", oaText("chunk1 ")}}},
		{name: "openai_tool_call", api: "openai", step: ToolCall("get_weather", `{"city": "Paris"}`), want: []ev{
			{"", oaRole},
			{"", oaChunk(`{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_m_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}`)},
			{"", oaChunk(`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null}`)},
			{"", oaChunk(`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}`)},
			{"", oaFinish("tool_calls")}, {"", oaUsage(2)}, {"", "[DONE]"}}},
		{name: "openai_malformed", api: "openai", step: Malformed(), want: []ev{
			{"", `{"id":"chatcmpl-m-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel`}}},
		{name: "anthropic_answer", api: "anthropic", step: Answer("Hi there"), want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"content_block_start", anBlock},
			{"content_block_delta", anText("Hi ")}, {"content_block_delta", anText("there")},
			{"content_block_stop", anBlockStop}, {"message_delta", anDelta("end_turn", 2)}, {"message_stop", anStop}}},
		{name: "anthropic_truncated", api: "anthropic", step: Truncated("Once"), want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"content_block_start", anBlock},
			{"content_block_delta", anText("Once")},
			{"content_block_stop", anBlockStop}, {"message_delta", anDelta("max_tokens", 1)}, {"message_stop", anStop}}},
		{name: "anthropic_refused", api: "anthropic", step: Refuse(""), want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"message_delta", anDelta("refusal", 0)}, {"message_stop", anStop}}},
		{name: "anthropic_empty", api: "anthropic", step: Answer(""), want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"message_delta", anDelta("end_turn", 0)}, {"message_stop", anStop}}},
		{name: "anthropic_stream_error", api: "anthropic", step: StreamError("overloaded_error"), want: []ev{
			{"message_start", anStart}, {"error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`}}},
		{name: "anthropic_drop", api: "anthropic", step: StreamDrop(1), wantErr: io.ErrUnexpectedEOF, want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"content_block_start", anBlock}, {"content_block_delta", anText("chunk1 ")}}},
		{name: "anthropic_unfinished", api: "anthropic", step: StreamUnfinished(2), want: []ev{
			{"message_start", anStart}, {"ping", anPing}, {"content_block_start", anBlock},
			{"content_block_delta", anText("chunk1 ")}, {"content_block_delta", anText("chunk2 ")}}},
		{name: "anthropic_tool_call", api: "anthropic", step: ToolCall("get_weather", `{"city": "Paris"}`), want: []ev{
			{"message_start", anStart}, {"ping", anPing},
			{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_m_1","name":"get_weather","input":{}}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": "}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`},
			{"content_block_stop", anBlockStop}, {"message_delta", anDelta("tool_use", 2)}, {"message_stop", anStop}}},
		{name: "anthropic_malformed", api: "anthropic", step: Malformed(), want: []ev{
			{"message_start", `{"type":"message_start","message":{"id":"msg_m_1","type":"mess`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			body := tc.body
			if body == "" {
				body = requestBody(tc.api, "m", true)
			}
			got := send(t.Context(), newClient(t), s, paths[tc.api], body)
			if got.resp == nil {
				t.Fatalf("request: %v", got.err)
			}
			if !errors.Is(got.err, tc.wantErr) {
				t.Errorf("reading the body: err = %v, want %v", got.err, tc.wantErr)
			}
			if got.resp.StatusCode != http.StatusOK {
				t.Errorf("status = %d, want 200", got.resp.StatusCode)
			}
			if ct := got.resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("content-type = %q, want text/event-stream", ct)
			}
			created := strconv.FormatInt(s.Requests()[0].Time.Unix(), 10)
			var want []event
			for _, e := range tc.want {
				data := strings.ReplaceAll(e.data, "CREATED", created)
				var v any = data
				if strings.HasPrefix(data, "{") && !strings.HasSuffix(tc.name, "malformed") {
					v = decode(t, []byte(data))
				}
				want = append(want, event{Name: e.name, Data: v})
			}
			if diff := cmp.Diff(want, parseSSE(t, got.body)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
