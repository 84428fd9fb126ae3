package llmretrytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// newServer starts a Server that the test closes when it ends.
func newServer(t *testing.T) *Server {
	t.Helper()
	s := NewServer()
	t.Cleanup(s.Close)
	return s
}

// newClient returns a client with its own connection pool, so that no
// test sees another's keep-alive connections, and closes them at the end.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// paths of the two endpoints, by API name.
var paths = map[string]string{
	"openai":    "/v1/chat/completions",
	"anthropic": "/v1/messages",
}

// requestBody is a minimal request body of api for model.
func requestBody(api, model string, stream bool) string {
	if api == "anthropic" {
		return fmt.Sprintf(`{"model":%q,"max_tokens":100,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	}
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":%q,"stream":%t%s,"messages":[{"role":"user","content":"hi"}]}`, model, stream, opts)
}

// result is what a client got: the response (nil when the request
// failed), its whole body, and the error of the request or of reading the
// body.
type result struct {
	resp *http.Response
	body []byte
	err  error
}

// send posts body to path and reads the whole response body.
func send(ctx context.Context, c *http.Client, s *Server, path, body string) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{resp: resp, body: b, err: err}
}

// call sends a minimal request for model to api's endpoint.
func call(t *testing.T, c *http.Client, s *Server, api, model string, stream bool) result {
	t.Helper()
	return send(t.Context(), c, s, paths[api], requestBody(api, model, stream))
}

// decode decodes JSON text, failing the test when it is not JSON.
func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("json.Unmarshal(%q) = %v", b, err)
	}
	return v
}

// event is one server-sent event: its name ("" when none) and its data,
// decoded when it is JSON and kept as a string when not ([DONE], or a
// malformed step's data).
type event struct {
	Name string
	Data any
}

// parseSSE splits a stream body into events, checking the framing the
// SDKs rely on: "event: " and "data: " lines, one data line per event,
// each event ended by a blank line.
func parseSSE(t *testing.T, body []byte) []event {
	t.Helper()
	if len(body) == 0 {
		return nil
	}
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("stream %q does not end with a blank line", body)
	}
	var events []event
	for _, block := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		var e event
		var data string
		lines := strings.Split(block, "\n")
		for _, line := range lines {
			switch {
			case strings.HasPrefix(line, "event: ") && e.Name == "" && data == "":
				e.Name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && data == "":
				data = strings.TrimPrefix(line, "data: ")
			default:
				t.Fatalf("unexpected SSE line %q in event %q", line, block)
			}
		}
		var v any
		if json.Unmarshal([]byte(data), &v) == nil {
			e.Data = v
		} else {
			e.Data = data
		}
		events = append(events, e)
	}
	return events
}

// tracer records the server's trace events on channels a test can wait on.
type tracer struct {
	started chan Request
	arrived chan Request
	ended   chan Request
}

// traceServer starts a server whose requests are reported as they arrive
// and as their handlers return.
func traceServer(t *testing.T) (*Server, *tracer) {
	t.Helper()
	s := newServer(t)
	return s, traceOf(s)
}

// traceOf reports s's requests as they arrive and as their handlers
// return.
func traceOf(s *Server) *tracer {
	tr := &tracer{started: make(chan Request, 100), arrived: make(chan Request, 100), ended: make(chan Request, 100)}
	s.mu.Lock()
	s.trace = func(ev string, r Request) {
		switch ev {
		case "start":
			tr.started <- r
		case "arrive":
			tr.arrived <- r
		case "end":
			tr.ended <- r
		}
	}
	s.mu.Unlock()
	return tr
}

// waitFor receives from ch, failing the test if nothing comes within a
// bound far above what any working server needs.
func waitFor(t *testing.T, ch <-chan Request, what string) Request {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("no %s within 5s", what)
		return Request{}
	}
}
