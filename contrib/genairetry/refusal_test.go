package genairetry_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

// Every reason Gemini gives for blocking content is a refusal, whether
// it stops the answer (finishReason) or blocks the prompt
// (promptFeedback.blockReason), in every mode. The scripted server has
// one refusal step; these are raw.
func TestRefusalReasons(t *testing.T) {
	t.Parallel()
	usage := `"usageMetadata":{"promptTokenCount":7,"totalTokenCount":7}`
	tests := []struct {
		name   string
		body   string // one GenerateContentResponse
		reason string
		raw    string // the text before the refusal, which the record keeps; "" for none
	}{
		{"safety", `{"candidates":[{"content":{"role":"model"},"finishReason":"SAFETY","index":0}],` + usage + `}`, "finishReason SAFETY", ""},
		{"prohibited_content", `{"candidates":[{"content":{"role":"model"},"finishReason":"PROHIBITED_CONTENT","index":0}],` + usage + `}`, "finishReason PROHIBITED_CONTENT", ""},
		{"blocklist", `{"candidates":[{"content":{"role":"model"},"finishReason":"BLOCKLIST","index":0}],` + usage + `}`, "finishReason BLOCKLIST", ""},
		{"spii", `{"candidates":[{"content":{"parts":[{"text":"Her number is"}],"role":"model"},"finishReason":"SPII","index":0}],` + usage + `}`, "finishReason SPII", "Her number is"},
		// Cut off where it began to recite a source: the text is not an
		// answer, however plausible it reads.
		{"recitation", `{"candidates":[{"content":{"parts":[{"text":"It was the best of times, it was the"}],"role":"model"},"finishReason":"RECITATION","index":0}],` + usage + `}`,
			"finishReason RECITATION", "It was the best of times, it was the"},
		{"image_recitation", `{"candidates":[{"content":{"role":"model"},"finishReason":"IMAGE_RECITATION","index":0}],` + usage + `}`, "finishReason IMAGE_RECITATION", ""},
		{"blocked_prompt", `{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},` + usage + `}`, "promptFeedback blockReason PROHIBITED_CONTENT", ""},
	}
	for _, tc := range tests {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.Contains(r.URL.Path, ":streamGenerateContent") {
						w.Header().Set("Content-Type", "text/event-stream")
						w.Write([]byte("data: " + tc.body + "\n\n"))
						return
					}
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(tc.body))
				}))
				defer srv.Close()
				client := clientAt(t, srv.URL+"/", nil)
				_, records, err := run(t.Context(), m.backend(client, "gemini-a", tiny, nil), m.backend(client, "gemini-b", tiny, nil))
				if err == nil {
					t.Fatal("Do() = nil error, want the refusal")
				}
				checkKinds(t, records, "gemini-a refused")
				if msg := records[0].Err.Error(); !strings.Contains(msg, tc.reason) {
					t.Errorf("record error %q, want the reason %q", msg, tc.reason)
				}
				if diff := cmp.Diff(&llmretry.Usage{InputTokens: 7}, records[0].Usage); diff != "" {
					t.Errorf("refused record's Usage (-want +got):\n%s", diff)
				}
				var want *string
				if tc.raw != "" {
					want = &tc.raw
				}
				if diff := cmp.Diff(want, records[0].RawText); diff != "" {
					t.Errorf("refused record's RawText (-want +got):\n%s", diff)
				}
				if llmretry.RetryItem(err) {
					t.Errorf("RetryItem(%v) = true, want false: the same content is refused again", err)
				}
			})
		}
	}
}
