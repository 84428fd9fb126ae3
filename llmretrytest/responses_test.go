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

// responsesPath is the Responses API's endpoint.
const responsesPath = "/v1/responses"

// responsesBody is a minimal Responses API request for model.
func responsesBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"input":"hi"}`, model, stream)
}

// rsObject is a response object as the endpoint sends it, with output
// the JSON of its output array and usage of its usage (or "null").
func rsObject(status, extra, output, usage string) string {
	return `{"id":"resp_m_1","object":"response","created_at":CREATED,"model":"m","status":"` + status + `",` +
		extra + `"output":` + output + `,"usage":` + usage + `}`
}

func rsMessage(status, text string) string {
	return `[{"type":"message","id":"msg_m_1","status":"` + status + `","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"` + text + `"}]}]`
}

// rsCall is a ToolCall's function_call item, with args as a JSON string's
// content.
func rsCall(status, args string) string {
	return `{"type":"function_call","id":"fc_m_1","status":"` + status + `","call_id":"call_m_1","name":"get_weather","arguments":"` + args + `"}`
}

func rsUsage(out, cached, reasoning int) string {
	return fmt.Sprintf(`{"input_tokens":10,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":%d},"total_tokens":%d}`,
		cached, out, reasoning, 10+out)
}

// rsNoEnd is a response's error and incomplete_details while it has
// neither.
const rsNoEnd = `"error":null,"incomplete_details":null,`

// The Responses API's JSON answers, field for field.
func TestResponsesJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		step Step
		want string // CREATED stands for the created time
	}{
		{"answer", Answer("Hi there"), rsObject("completed", rsNoEnd, rsMessage("completed", "Hi there"), rsUsage(2, 0, 0))},
		{"usage_details", Answer("Hi").WithUsageDetails(4, 1), rsObject("completed", rsNoEnd, rsMessage("completed", "Hi"), rsUsage(1, 4, 1))},
		{"empty", Answer(""), rsObject("completed", rsNoEnd, `[]`, rsUsage(0, 0, 0))},
		{"truncated", Truncated("Once upon"), rsObject("incomplete", `"error":null,"incomplete_details":{"reason":"max_output_tokens"},`,
			rsMessage("incomplete", "Once upon"), rsUsage(2, 0, 0))},
		{"refused", Refuse("I can"), rsObject("incomplete", `"error":null,"incomplete_details":{"reason":"content_filter"},`,
			rsMessage("incomplete", "I can"), rsUsage(2, 0, 0))},
		{"failed", Failed("server_error"), rsObject("failed",
			`"error":{"code":"server_error","message":"The model failed to generate a response: server_error."},"incomplete_details":null,`,
			`[]`, rsUsage(0, 0, 0))},
		{"unfinished", StreamUnfinished(1), rsObject("in_progress", rsNoEnd, rsMessage("incomplete", "chunk1 "), rsUsage(1, 0, 0))},
		{"tool_call", ToolCall("get_weather", `{"city": "Paris"}`), rsObject("completed", rsNoEnd, `[`+rsCall("completed", `{\"city\": \"Paris\"}`)+`]`, rsUsage(2, 0, 0))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			got := send(t.Context(), newClient(t), s, responsesPath, responsesBody("m", false))
			if got.err != nil {
				t.Fatalf("request: %v", got.err)
			}
			if got.resp.StatusCode != http.StatusOK || got.resp.Header.Get("X-Request-Id") != "req_m_1" {
				t.Errorf("status = %d, x-request-id = %q; want 200, req_m_1", got.resp.StatusCode, got.resp.Header.Get("X-Request-Id"))
			}
			log := s.Requests()
			if log[0].API != "openai-responses" || log[0].Stream {
				t.Errorf("logged %+v, want api openai-responses, no stream", log[0])
			}
			created := strconv.FormatInt(log[0].Time.Unix(), 10)
			want := decode(t, []byte(strings.ReplaceAll(tc.want, "CREATED", created)))
			if diff := cmp.Diff(want, decode(t, got.body)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// The Responses API's streams, event for event: each named by its type,
// from response.created to the event of how the response ended.
func TestResponsesStreams(t *testing.T) {
	t.Parallel()
	created := func(seq int) event {
		return event{"response.created", `{"type":"response.created","sequence_number":` + strconv.Itoa(seq) + `,"response":` +
			rsObject("in_progress", rsNoEnd, `[]`, "null") + `}`}
	}
	delta := func(seq int, text string) event {
		return event{"response.output_text.delta", fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":%d,`+
			`"item_id":"msg_m_1","output_index":0,"content_index":0,"delta":%q,"logprobs":[]}`, seq, text)}
	}
	end := func(name string, seq int, response string) event {
		return event{name, fmt.Sprintf(`{"type":%q,"sequence_number":%d,"response":%s}`, name, seq, response)}
	}
	tests := []struct {
		name    string
		step    Step
		want    []event // Data as JSON text
		wantErr error   // of reading the body
	}{
		{name: "answer", step: Answer("Hi there"), want: []event{created(0), delta(1, "Hi "), delta(2, "there"),
			end("response.completed", 3, rsObject("completed", rsNoEnd, rsMessage("completed", "Hi there"), rsUsage(2, 0, 0)))}},
		{name: "truncated", step: Truncated("Once"), want: []event{created(0), delta(1, "Once"),
			end("response.incomplete", 2, rsObject("incomplete", `"error":null,"incomplete_details":{"reason":"max_output_tokens"},`,
				rsMessage("incomplete", "Once"), rsUsage(1, 0, 0)))}},
		{name: "failed", step: Failed("rate_limit_exceeded"), want: []event{created(0),
			end("response.failed", 1, rsObject("failed",
				`"error":{"code":"rate_limit_exceeded","message":"The model failed to generate a response: rate_limit_exceeded."},"incomplete_details":null,`,
				`[]`, rsUsage(0, 0, 0)))}},
		{name: "stream_error", step: StreamError("server_error"), want: []event{created(0),
			{"error", `{"type":"error","sequence_number":1,"code":"server_error","message":"The server had an error while processing your request: server_error."}`}}},
		{name: "drop", step: StreamDrop(1), wantErr: io.ErrUnexpectedEOF, want: []event{created(0), delta(1, "chunk1 ")}},
		{name: "unfinished", step: StreamUnfinished(1), want: []event{created(0), delta(1, "chunk1 ")}},
		{name: "tool_call", step: ToolCall("get_weather", `{"city": "Paris"}`), want: []event{created(0),
			{"response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":` + rsCall("in_progress", "") + `}`},
			{"response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":2,"item_id":"fc_m_1","output_index":0,"delta":"{\"city\": "}`},
			{"response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":3,"item_id":"fc_m_1","output_index":0,"delta":"\"Paris\"}"}`},
			{"response.function_call_arguments.done", `{"type":"response.function_call_arguments.done","sequence_number":4,"item_id":"fc_m_1","output_index":0,"arguments":"{\"city\": \"Paris\"}"}`},
			{"response.output_item.done", `{"type":"response.output_item.done","sequence_number":5,"output_index":0,"item":` + rsCall("completed", `{\"city\": \"Paris\"}`) + `}`},
			end("response.completed", 6, rsObject("completed", rsNoEnd, `[`+rsCall("completed", `{\"city\": \"Paris\"}`)+`]`, rsUsage(2, 0, 0)))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			got := send(t.Context(), newClient(t), s, responsesPath, responsesBody("m", true))
			if got.resp == nil {
				t.Fatalf("request: %v", got.err)
			}
			if !errors.Is(got.err, tc.wantErr) {
				t.Errorf("reading the body: err = %v, want %v", got.err, tc.wantErr)
			}
			if ct := got.resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("content-type = %q, want text/event-stream", ct)
			}
			createdAt := strconv.FormatInt(s.Requests()[0].Time.Unix(), 10)
			var want []event
			for _, e := range tc.want {
				want = append(want, event{Name: e.Name, Data: decode(t, []byte(strings.ReplaceAll(e.Data.(string), "CREATED", createdAt)))})
			}
			if diff := cmp.Diff(want, parseSSE(t, got.body)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// The Responses endpoint reports rate limits as the Chat endpoint does,
// and its errors are OpenAI's: a filtered prompt is Azure's 400
// content_filter.
func TestResponsesErrorsAndLimits(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", ContentFilter())
	s.Limit("m", Limits{Requests: Bucket{Rate: 1, Burst: 5}})
	got := send(t.Context(), newClient(t), s, responsesPath, responsesBody("m", false))
	if got.err != nil {
		t.Fatalf("request: %v", got.err)
	}
	if got.resp.StatusCode != http.StatusBadRequest || got.resp.Header.Get("X-Ratelimit-Remaining-Requests") != "4" {
		t.Errorf("status = %d, x-ratelimit-remaining-requests = %q; want 400, 4",
			got.resp.StatusCode, got.resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	}
	want := decode(t, []byte(`{"error":{"type":"invalid_request_error","code":"content_filter","param":"prompt",`+
		`"message":"The response was filtered due to the prompt triggering the content management policy. Please modify your prompt and retry."}}`))
	if diff := cmp.Diff(want, decode(t, got.body)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if step := s.Requests()[0].Step; step != "status 400 content_filter" {
		t.Errorf("logged step = %q, want %q", step, "status 400 content_filter")
	}
}

// The log records the usage a Responses answer told its client: a JSON
// answer's, a stream's once its last event is sent, and none for a
// stream cut before it.
func TestResponsesLogUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		step   Step
		stream bool
		want   *Usage
	}{
		{"json", Answer("Hi there").WithUsageDetails(3, 1), false, &Usage{InputTokens: 10, OutputTokens: 2, CachedInputTokens: 3, ReasoningTokens: 1}},
		{"stream", Truncated("Once upon"), true, &Usage{InputTokens: 10, OutputTokens: 2}},
		{"stream_cut", StreamDrop(2), true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			_ = send(t.Context(), newClient(t), s, responsesPath, responsesBody("m", tc.stream))
			if diff := cmp.Diff(tc.want, s.Requests()[0].Usage); diff != "" {
				t.Errorf("logged usage (-want +got):\n%s", diff)
			}
		})
	}
}
