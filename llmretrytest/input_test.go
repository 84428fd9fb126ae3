package llmretrytest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A request body the server cannot use gets an error in the provider's
// shape and is logged with Model "".
func TestBadRequestBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		api      string
		body     string
		want     int
		wantType string
		wantLog  string
	}{
		{"openai_not_json", "openai", `{"model": "m", `, 400, "invalid_request_error", "status 400"},
		{"openai_empty", "openai", ``, 400, "invalid_request_error", "status 400"},
		{"openai_no_model", "openai", `{"messages": []}`, 400, "invalid_request_error", "status 400"},
		{"openai_model_not_a_string", "openai", `{"model": 4}`, 400, "invalid_request_error", "status 400"},
		{"openai_stream_not_a_bool", "openai", `{"model": "m", "stream": "yes"}`, 400, "invalid_request_error", "status 400"},
		{"openai_array", "openai", `[1, 2]`, 400, "invalid_request_error", "status 400"},
		{"anthropic_not_json", "anthropic", "\x00\xff", 400, "invalid_request_error", "status 400"},
		{"anthropic_null", "anthropic", `null`, 400, "invalid_request_error", "status 400"},
		{"anthropic_too_large", "anthropic", `{"model":"m","x":"` + strings.Repeat("a", maxBody) + `"}`, 413, "request_too_large", "status 413"},
		{"openai_too_large", "openai", strings.Repeat(" ", maxBody+1), 413, "invalid_request_error", "status 413"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			s.Script("m", Answer("hi"))
			got := send(t.Context(), newClient(t), s, paths[tc.api], tc.body)
			if got.err != nil || got.status() != tc.want {
				t.Fatalf("status %d, err %v; want %d", got.status(), got.err, tc.want)
			}
			body, _ := decode(t, got.body).(map[string]any)
			errObj, _ := body["error"].(map[string]any)
			if errObj["type"] != tc.wantType || errObj["message"] == "" {
				t.Errorf("body = %s, want an error of type %s with a message", got.body, tc.wantType)
			}
			if tc.api == "anthropic" && body["type"] != "error" {
				t.Errorf("body = %s, want type error", got.body)
			}
			want := []Request{{API: tc.api, N: 1, Step: tc.wantLog}}
			if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header")); diff != "" {
				t.Errorf("Requests() (-want +got):\n%s", diff)
			}
		})
	}
}

// Other methods and paths get an error and are not logged.
func TestOtherMethodsAndPaths(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("hi"))
	c := newClient(t)
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/chat/completions", http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/messages", http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/completions", http.StatusNotFound},
		{http.MethodPost, "/v1/chat/completions/", http.StatusNotFound},
		{http.MethodGet, "/", http.StatusNotFound},
	}
	for _, tc := range tests {
		req, err := http.NewRequest(tc.method, s.URL+tc.path, strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		body := make([]byte, 1024)
		n, _ := resp.Body.Read(body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
		if !strings.Contains(string(body[:n]), `"error"`) {
			t.Errorf("%s %s: body %q, want an error body", tc.method, tc.path, body[:n])
		}
	}
	if got := s.Requests(); len(got) != 0 {
		t.Errorf("Requests() = %v, want none", got)
	}
}

// Whatever the body, the server answers: it never panics or hangs up on
// bad input. The seeds run with go test; go test -fuzz explores further.
func FuzzRequestBody(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `null`, `{"model":"m"}`, `{"model":"m","stream":true}`,
		`{"model":"m","stream":true,"stream_options":null}`, `{"model":"m","stream_options":{"include_usage":"x"}}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, `{"model":"\u0000\n"}`, `{"model":"m"`, "\xff",
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	s := NewServer()
	f.Cleanup(s.Close)
	s.Script("m", Answer("hi"))
	tr := &http.Transport{}
	f.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	f.Fuzz(func(t *testing.T, body string, anthropic bool) {
		path := paths["openai"]
		if anthropic {
			path = paths["anthropic"]
		}
		got := send(t.Context(), c, s, path, body)
		if got.err != nil {
			t.Fatalf("body %q: %v", body, got.err)
		}
		switch got.status() {
		case 200, 400, 404:
		default:
			t.Fatalf("body %q: status %d, want 200, 400 or 404", body, got.status())
		}
	})
}
