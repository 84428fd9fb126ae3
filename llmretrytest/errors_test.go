package llmretrytest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Error responses: the status, the provider's error body, the request id
// and the step's own headers.
func TestErrorResponses(t *testing.T) {
	t.Parallel()
	oa := func(msg, typ, param, code string) string {
		q := func(s string) string {
			if s == "" {
				return "null"
			}
			return `"` + s + `"`
		}
		return `{"error":{"message":"` + msg + `","type":"` + typ + `","param":` + q(param) + `,"code":` + q(code) + `}}`
	}
	an := func(typ, msg string) string {
		return `{"type":"error","error":{"type":"` + typ + `","message":"` + msg + `"}}`
	}
	const (
		oa5xx = "The server had an error while processing your request. Sorry about that!"
		oa4xx = "Invalid request ("
	)
	tests := []struct {
		name       string
		api        string
		stream     bool
		step       Step
		wantStatus int
		wantBody   string
	}{
		{"openai_400", "openai", false, Status(400), 400, oa(oa4xx+"400).", "invalid_request_error", "", "")},
		{"openai_401", "openai", false, Status(401), 401, oa("Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key")},
		{"openai_403", "openai", false, Status(403), 403, oa(oa4xx+"403).", "invalid_request_error", "", "")},
		{"openai_404", "openai", false, Status(404), 404, oa("The model `m` does not exist or you do not have access to it.", "invalid_request_error", "", "model_not_found")},
		{"openai_429", "openai", false, Status(429), 429, oa("Rate limit reached for requests.", "requests", "", "rate_limit_exceeded")},
		{"openai_500", "openai", false, Status(500), 500, oa(oa5xx, "server_error", "", "")},
		{"openai_502", "openai", true, Status(502), 502, oa(oa5xx, "server_error", "", "")},
		{"openai_503", "openai", false, Status(503), 503, oa("The server is overloaded or not ready yet.", "server_error", "", "")},
		{"openai_529", "openai", false, Status(529), 529, oa(oa5xx, "server_error", "", "")},
		{"openai_quota", "openai", false, InsufficientQuota(), 429,
			oa("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota", "", "insufficient_quota")},
		{"openai_quota_stream", "openai", true, InsufficientQuota(), 429,
			oa("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota", "", "insufficient_quota")},
		{"openai_context_length", "openai", false, ContextLengthExceeded(), 400,
			oa("This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.",
				"invalid_request_error", "messages", "context_length_exceeded")},
		{"openai_stream_error_as_json", "openai", false, StreamError("server_error"), 500,
			oa("The server had an error while processing your request: server_error.", "server_error", "", "")},
		{"anthropic_400", "anthropic", false, Status(400), 400, an("invalid_request_error", "Invalid request.")},
		{"anthropic_401", "anthropic", false, Status(401), 401, an("authentication_error", "invalid x-api-key")},
		{"anthropic_403", "anthropic", false, Status(403), 403, an("permission_error", "Your API key does not have permission to use the specified resource.")},
		{"anthropic_404", "anthropic", false, Status(404), 404, an("not_found_error", "model: m")},
		{"anthropic_409", "anthropic", false, Status(409), 409, an("invalid_request_error", "Invalid request.")},
		{"anthropic_413", "anthropic", false, Status(413), 413, an("request_too_large", "Request exceeds the maximum allowed number of bytes.")},
		{"anthropic_429", "anthropic", false, Status(429), 429, an("rate_limit_error", "This request would exceed your organization's rate limit. Please try again later.")},
		{"anthropic_500", "anthropic", false, Status(500), 500, an("api_error", "Internal server error")},
		{"anthropic_503", "anthropic", true, Status(503), 503, an("api_error", "Internal server error")},
		{"anthropic_529", "anthropic", false, Status(529), 529, an("overloaded_error", "Overloaded")},
		{"anthropic_quota", "anthropic", false, InsufficientQuota(), 429, an("rate_limit_error", "This request would exceed your organization's rate limit. Please try again later.")},
		{"anthropic_context_length", "anthropic", true, ContextLengthExceeded(), 400, an("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")},
		{"anthropic_overloaded_as_json", "anthropic", false, StreamError("overloaded_error"), 529, an("overloaded_error", "Overloaded")},
		{"anthropic_rate_limit_as_json", "anthropic", false, StreamError("rate_limit_error"), 429,
			an("rate_limit_error", "This request would exceed your organization's rate limit. Please try again later.")},
		{"anthropic_invalid_as_json", "anthropic", false, StreamError("invalid_request_error"), 400, an("invalid_request_error", "Invalid request.")},
		{"anthropic_other_as_json", "anthropic", false, StreamError("api_error"), 500, an("api_error", "Internal server error")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", tc.step)
			got := call(t, newClient(t), s, tc.api, "m", tc.stream)
			if got.err != nil {
				t.Fatalf("request: %v", got.err)
			}
			if got.resp.StatusCode != tc.wantStatus {
				t.Errorf("status = %d, want %d", got.resp.StatusCode, tc.wantStatus)
			}
			if ct := got.resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content-type = %q, want application/json", ct)
			}
			idHeader := map[string]string{"openai": "X-Request-Id", "anthropic": "Request-Id"}[tc.api]
			if id := got.resp.Header.Get(idHeader); id != "req_m_1" {
				t.Errorf("%s = %q, want req_m_1", idHeader, id)
			}
			if diff := cmp.Diff(decode(t, []byte(tc.wantBody)), decode(t, got.body)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// Headers added to a step are sent as given; they replace the server's
// own value for the same key, and repeat when named twice.
func TestWithHeader(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	base := Status(429)
	s.Script("m", base.
		WithHeader("retry-after", "1").
		WithHeader("Retry-After-Ms", "300").
		WithHeader("x-should-retry", "true").
		WithHeader("X-Request-Id", "mine").
		WithHeader("x-extra", "a").
		WithHeader("x-extra", "b"))
	s.Script("plain", base)
	c := newClient(t)
	got := call(t, c, s, "openai", "m", false)
	if got.err != nil {
		t.Fatal(got.err)
	}
	want := http.Header{
		"Retry-After":    {"1"},
		"Retry-After-Ms": {"300"},
		"X-Should-Retry": {"true"},
		"X-Request-Id":   {"mine"},
		"X-Extra":        {"a", "b"},
	}
	for key, values := range want {
		if diff := cmp.Diff(values, got.resp.Header.Values(key)); diff != "" {
			t.Errorf("header %s (-want +got):\n%s", key, diff)
		}
	}
	// The headers belong to the copy: base, used in another script, has none.
	plain := call(t, c, s, "anthropic", "plain", true)
	if plain.err != nil {
		t.Fatal(plain.err)
	}
	for _, key := range []string{"Retry-After", "X-Extra", "X-Request-Id"} {
		if v := plain.resp.Header.Values(key); len(v) != 0 {
			t.Errorf("plain step sent %s: %q, want none", key, v)
		}
	}
	if id := plain.resp.Header.Get("Request-Id"); id != "req_plain_1" {
		t.Errorf("request-id = %q, want req_plain_1", id)
	}
	// Headers go on streams and answers too.
	s.Script("stream", Answer("hi").WithHeader("x-extra", "s"))
	st := call(t, c, s, "anthropic", "stream", true)
	if st.err != nil || st.resp.Header.Get("X-Extra") != "s" {
		t.Errorf("stream: x-extra = %q, err %v; want \"s\", nil", st.resp.Header.Get("X-Extra"), st.err)
	}
}

// JSON requests for the stream-only steps play their nearest JSON
// equivalent.
func TestStreamStepsAsJSON(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"openai", "anthropic"} {
		t.Run(api+"_drop", func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", StreamDrop(3))
			got := call(t, newClient(t), s, api, "m", false)
			if got.resp == nil || got.resp.StatusCode != 200 {
				t.Fatalf("response = %v, err %v; want a 200", got.resp, got.err)
			}
			if got.err != io.ErrUnexpectedEOF {
				t.Errorf("reading the body: err = %v, want unexpected EOF", got.err)
			}
			if !strings.HasPrefix(string(got.body), "{") || strings.Contains(string(got.body), "usage") {
				t.Errorf("body = %q, want the first half of a JSON answer", got.body)
			}
		})
		t.Run(api+"_malformed", func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", Malformed())
			got := call(t, newClient(t), s, api, "m", false)
			if got.err != nil || got.resp.StatusCode != 200 {
				t.Fatalf("response = %v, err %v; want a complete 200", got.resp, got.err)
			}
			if json.Valid(got.body) {
				t.Errorf("body %q decodes; want malformed JSON", got.body)
			}
		})
	}
}

// A StreamError played to a request that did not ask for a stream is the
// HTTP error its type stands for.
func TestStreamErrorStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		errType string
		want    int
	}{
		{"overloaded_error", 529},
		{"rate_limit_error", 429},
		{"insufficient_quota", 429},
		{"requests", 429},
		{"tokens", 429},
		{"invalid_request_error", 400},
		{"authentication_error", 401},
		{"permission_error", 403},
		{"not_found_error", 404},
		{"request_too_large", 413},
		{"api_error", 500},
		{"server_error", 500},
		{"", 500},
	}
	s := newServer(t)
	c := newClient(t)
	for _, tc := range tests {
		for _, api := range []string{"openai", "anthropic"} {
			model := "m_" + tc.errType + "_" + api
			s.Script(model, StreamError(tc.errType))
			got := call(t, c, s, api, model, false)
			if got.err != nil || got.status() != tc.want {
				t.Errorf("%s StreamError(%q): status %d, err %v; want %d", api, tc.errType, got.status(), got.err, tc.want)
			}
		}
	}
}
