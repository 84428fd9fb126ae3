package llmretrytest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// geminiPost sends a Gemini request for model, streamed or not, and
// returns the response's status and body.
func geminiPost(t *testing.T, s *Server, model string, stream bool) (int, string) {
	t.Helper()
	url := s.GeminiBaseURL() + "v1beta/models/" + model + ":generateContent"
	if stream {
		url = s.GeminiBaseURL() + "v1beta/models/" + model + ":streamGenerateContent?alt=sse"
	}
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func TestGeminiWire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		step   Step
		stream bool
		status int
		want   string // the body, JSON compared as values; for a stream its data events joined by newlines
	}{
		{"answer", Answer("Hi there"), false, 200, `{"candidates":[{"content":{"parts":[{"text":"Hi there"}],"role":"model"},"finishReason":"STOP","index":0}],
			"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"truncated", Truncated("Once"), false, 200, `{"candidates":[{"content":{"parts":[{"text":"Once"}],"role":"model"},"finishReason":"MAX_TOKENS","index":0}],
			"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":1,"totalTokenCount":11},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"refused", Refuse(""), false, 200, `{"candidates":[{"content":{"role":"model"},"finishReason":"SAFETY","index":0}],
			"usageMetadata":{"promptTokenCount":10,"totalTokenCount":10},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"unavailable", Status(503), false, 503, `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`},
		{"retry_delay", RetryDelay(1500 * time.Millisecond), false, 429, `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[
			{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_requests",
				"quotaId":"GenerateRequestsPerMinutePerProjectPerModel","quotaDimensions":{"location":"global","model":"gemini"},"quotaValue":"50"}]},
			{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}`},
		{"stream", Answer("Hi there"), true, 200, `{"candidates":[{"content":{"parts":[{"text":"Hi "}],"role":"model"},"index":0}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":1,"totalTokenCount":11},"modelVersion":"m","responseId":"resp_m_1"}
{"candidates":[{"content":{"parts":[{"text":"there"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"details", Answer("Hi there").WithUsageDetails(4, 1), false, 200, `{"candidates":[{"content":{"parts":[{"text":"Hi there"}],"role":"model"},"finishReason":"STOP","index":0}],
			"usageMetadata":{"promptTokenCount":10,"cachedContentTokenCount":4,"candidatesTokenCount":1,"thoughtsTokenCount":1,"totalTokenCount":12},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"tool_call", ToolCall("get_weather", `{"city": "Paris"}`), false, 200, `{"candidates":[{"content":{"parts":[{"functionCall":{"name":"get_weather","args":{"city":"Paris"}}}],"role":"model"},"finishReason":"STOP","index":0}],
			"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"tool_call_stream", ToolCall("get_weather", `{"city": "Paris"}`), true, 200, `{"candidates":[{"content":{"parts":[{"functionCall":{"name":"get_weather","args":{"city":"Paris"}}}],"role":"model"},"finishReason":"STOP","index":0}],
			"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12},"modelVersion":"m","responseId":"resp_m_1"}`},
		{"stream_error", StreamError("UNAVAILABLE"), true, 200, `{"error":{"code":503,"message":"The service encountered an error: UNAVAILABLE.","status":"UNAVAILABLE"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			status, body := geminiPost(t, s, "m", tc.stream)
			if status != tc.status {
				t.Errorf("status = %d, want %d", status, tc.status)
			}
			var gotEvents []any
			if tc.stream {
				for ev := range strings.SplitSeq(strings.TrimSpace(body), "\n\n") {
					data, ok := strings.CutPrefix(ev, "data: ")
					if !ok {
						t.Fatalf("stream event %q is not a data event", ev)
					}
					gotEvents = append(gotEvents, decode(t, []byte(data)))
				}
			} else {
				gotEvents = []any{decode(t, []byte(body))}
			}
			var wantEvents []any
			for line := range strings.SplitSeq(tc.want, "\n{") {
				if !strings.HasPrefix(line, "{") {
					line = "{" + line
				}
				wantEvents = append(wantEvents, decode(t, []byte(line)))
			}
			if diff := cmp.Diff(wantEvents, gotEvents); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			log := s.Requests()
			if len(log) != 1 || log[0].Model != "m" || log[0].API != "gemini" || log[0].Stream != tc.stream || log[0].Step != tc.step.String() {
				t.Fatalf("Requests() = %+v, want one gemini request for m, stream %v, step %q", log, tc.stream, tc.step.String())
			}
			// The log holds the usage the body told the client; an error
			// told none.
			var wantUsage *Usage
			if tc.status == http.StatusOK && tc.step.kind != kindStreamError {
				u := answerUsage(tc.step)
				wantUsage = &u
			}
			if diff := cmp.Diff(wantUsage, log[0].Usage); diff != "" {
				t.Errorf("logged Usage (-want +got):\n%s", diff)
			}
		})
	}
}

// Other paths under v1beta are not Gemini's generateContent, and an
// unknown model gets Google's NOT_FOUND.
func TestGeminiPaths(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	for _, path := range []string{"v1beta/models/m:countTokens", "v1beta/models/:generateContent", "v1beta/files"} {
		resp, err := http.Post(s.GeminiBaseURL()+path, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST /%s = %d, want 404", path, resp.StatusCode)
		}
	}
	status, body := geminiPost(t, s, "nope", false)
	if status != http.StatusNotFound || !strings.Contains(body, `"status":"NOT_FOUND"`) {
		t.Errorf("unknown model = %d %s, want Google's 404", status, body)
	}
	if got := len(s.Requests()); got != 1 {
		t.Errorf("logged %d requests, want 1 (the unknown model's)", got)
	}
}
