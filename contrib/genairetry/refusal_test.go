package genairetry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A refusal ends the chain with the provider's reason: the next provider
// is not asked the content Gemini's safety system refused.
func TestRefusalEndsChain(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gemini-a", llmretrytest.Refuse("I will not"))
			srv.Script("gemini-b", llmretrytest.Answer("from b"))
			client := newClient(t, srv)
			_, records, err := run(t.Context(),
				m.backend(client, "gemini-a", tiny, nil),
				m.backend(client, "gemini-b", tiny, nil))
			var ex *llmretry.Exhausted
			if !errors.As(err, &ex) {
				t.Fatalf("Do() = %v, want an *llmretry.Exhausted", err)
			}
			checkKinds(t, records, "gemini-a refused")
			why := llmretry.WhyRefused
			if m.emit {
				why = llmretry.WhyDelivered // the caller holds the words before the refusal: nothing else could be tried
			}
			if got := records[0]; got.Why != why || !strings.Contains(got.Err.Error(), "finishReason SAFETY") {
				t.Errorf("record why %q, error %q; want %q and the finish reason", got.Why, got.Err, why)
			}
			if raw := records[0].RawText; raw == nil || *raw != "I will not" {
				t.Errorf("refused record's RawText = %v, want the text before the refusal", raw)
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 3}, records[0].Usage); diff != "" {
				t.Errorf("refused record's Usage (-want +got):\n%s", diff)
			}
			if llmretry.RetryItem(err) {
				t.Errorf("RetryItem(%v) = true, want false: the same content is refused again", err)
			}
			matchLog(t, records, err, srv)
		})
	}
}

// With FailOverRefused the next backend is asked instead.
func TestRefusalFailsOverWhenAsked(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("gemini-a", llmretrytest.Refuse(""))
	srv.Script("gemini-b", llmretrytest.Answer("from b"))
	client := newClient(t, srv)
	var records []llmretry.Attempt
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends:        []llmretry.Backend[string, llmretry.Completion]{jsonMode.backend(client, "gemini-a", tiny, nil), jsonMode.backend(client, "gemini-b", tiny, nil)},
		FailOverRefused: true,
		OnAttempt:       func(_ context.Context, a llmretry.Attempt) { records = append(records, a) },
	}
	answer, err := chain.Do(t.Context(), "Say hello.")
	if err != nil || answer.Text != "from b" {
		t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
	}
	checkKinds(t, records, "gemini-a refused", "gemini-b ok")
	matchLog(t, records, err, srv)
}

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
