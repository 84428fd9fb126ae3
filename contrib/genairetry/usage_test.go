package genairetry_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

// Gemini's usageMetadata reaches the record and the answer, thoughts
// counted as output and reasoning, cached tokens as part of the input.
func TestUsageFromUsageMetadata(t *testing.T) {
	t.Parallel()
	const body = `{"candidates":[{"content":{"parts":[{"text":"thinking...","thought":true},{"text":"Hello."}],"role":"model"},"finishReason":"STOP","index":0}],` +
		`"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":5,"thoughtsTokenCount":40,"totalTokenCount":145},` +
		`"modelVersion":"gemini-2.5-flash-001"}`
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.Contains(r.URL.Path, ":streamGenerateContent") {
					w.Header().Set("Content-Type", "text/event-stream")
					w.Write([]byte("data: " + body + "\n\n"))
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(body))
			}))
			defer srv.Close()
			answer, records, err := run(t.Context(), m.backend(clientAt(t, srv.URL+"/", nil), "gemini-a", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want the answer", err)
			}
			want := &llmretry.Usage{InputTokens: 100, OutputTokens: 45, CachedInputTokens: 60, ReasoningTokens: 40}
			if diff := cmp.Diff(want, records[0].Usage); diff != "" {
				t.Errorf("record's Usage (-want +got):\n%s", diff)
			}
			// The thought is not the answer; the model is the one that
			// answered, as Gemini names it.
			if answer.Text != "Hello." || answer.InputTokens != 100 || answer.OutputTokens != 45 || answer.Model != "gemini-2.5-flash-001" {
				t.Errorf("Do() = %+v, want text %q, 100 in, 45 out, model gemini-2.5-flash-001", answer, "Hello.")
			}
		})
	}
}
