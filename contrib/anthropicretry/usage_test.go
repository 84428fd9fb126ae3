package anthropicretry_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// billed is the usage the scripted server reports for an answer of n
// text chunks: 10 prompt tokens, one output token per chunk.
func billed(n int64) *llmretry.Usage { return &llmretry.Usage{InputTokens: 10, OutputTokens: n} }

// Every record carries the usage the server reported for its request: an
// answer's, and a billed failure's (a truncation, an unusable answer, a
// refusal, a stream cut after message_start, which reports input_tokens
// 10 and output_tokens 1). A request that got no usage has none: unknown,
// not zero.
func TestUsageInRecords(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		modes []mode
		step  llmretrytest.Step
		want  *llmretry.Usage // the first record's
	}{
		{"answer", modes, llmretrytest.Answer("Hello there, friend."), billed(3)},
		{"truncated", modes, llmretrytest.Truncated("The answer is"), billed(3)},
		{"parse_failure", modes, llmretrytest.Answer(""), billed(0)},
		{"refused", modes, llmretrytest.Refuse("I can't"), billed(2)},
		{"cut_after_message_start", []mode{streamMode, bufferedMode}, llmretrytest.StreamDrop(2), billed(1)},
		{"unfinished_after_message_start", []mode{streamMode, bufferedMode}, llmretrytest.StreamUnfinished(2), billed(1)},
		{"error_event_after_message_start", []mode{streamMode, bufferedMode}, llmretrytest.StreamError("overloaded_error"), billed(1)},
		// No usage seen: the JSON body was cut, no response came, or the
		// provider refused the request outright.
		{"json_body_cut", []mode{jsonMode}, llmretrytest.StreamDrop(2), nil},
		{"hangup", modes, llmretrytest.Hangup(), nil},
		{"status_503", modes, llmretrytest.Status(503), nil},
	}
	for _, tc := range tests {
		for _, m := range tc.modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("claude-a", tc.step)
				// One try, so the record is the one request's.
				_, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", llmretry.Policy{}, nil))
				if len(records) != 1 {
					t.Fatalf("Do() made %d attempts, want 1", len(records))
				}
				if diff := cmp.Diff(tc.want, records[0].Usage); diff != "" {
					t.Errorf("record's Usage (-want +got):\n%s", diff)
				}
				matchLog(t, records, err, srv)
			})
		}
	}
}

// Anthropic counts the prompt tokens read from and written to its cache
// apart from input_tokens; the record's InputTokens is the whole prompt,
// and CachedInputTokens the part read from the cache.
func TestUsageCountsCache(t *testing.T) {
	t.Parallel()
	const usage = `"usage":{"input_tokens":4,"cache_read_input_tokens":5,"cache_creation_input_tokens":1,"output_tokens":2}`
	bodies := map[string]struct{ contentType, body string }{
		"json": {"application/json", `{"id":"msg_1","type":"message","role":"assistant","model":"claude-a",` +
			`"content":[{"type":"text","text":"Hello there"}],"stop_reason":"end_turn","stop_sequence":null,` + usage + `}`},
		"stream": {"text/event-stream", sse("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message",`+
			`"role":"assistant","model":"claude-a","content":[],"stop_reason":null,"stop_sequence":null,`+
			`"usage":{"input_tokens":4,"cache_read_input_tokens":5,"cache_creation_input_tokens":1,"output_tokens":1}}}`) +
			evBlock + evHello + evBlockStop +
			sse("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`) +
			evStop},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			resp := bodies["json"]
			if m.stream {
				resp = bodies["stream"]
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", resp.contentType)
				w.Write([]byte(resp.body))
			}))
			defer srv.Close()
			client := anthropic.NewClient(option.WithBaseURL(srv.URL+"/"), option.WithAPIKey(fakeKey))
			_, records, err := run(t.Context(), m.backend(client, "claude-a", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want the answer", err)
			}
			want := &llmretry.Usage{InputTokens: 10, OutputTokens: 2, CachedInputTokens: 5}
			if diff := cmp.Diff(want, records[0].Usage); diff != "" {
				t.Errorf("record's Usage (-want +got):\n%s", diff)
			}
		})
	}
}
