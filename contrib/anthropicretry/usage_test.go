package anthropicretry_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

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
