package llmretrytest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Hangup closes the connection before any response: the client's request
// fails with io.EOF, and the server goes on serving.
func TestHangup(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"openai", "anthropic"} {
		for _, stream := range []bool{false, true} {
			s := newServer(t)
			s.Script("m", Hangup(), Answer("back"))
			c := newClient(t)
			got := call(t, c, s, api, "m", stream)
			if got.resp != nil || !errors.Is(got.err, io.EOF) {
				t.Errorf("%s stream=%v: response %v, err %v; want no response and io.EOF", api, stream, got.resp, got.err)
			}
			if again := call(t, c, s, api, "m", stream); again.err != nil || again.status() != 200 {
				t.Errorf("%s stream=%v: after the hangup: status %d, err %v; want 200", api, stream, again.status(), again.err)
			}
			want := []Request{{Model: "m", API: api, Stream: stream, N: 1, Step: "hangup"}, {Model: "m", API: api, Stream: stream, N: 2, Step: "answer"}}
			if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header", "Usage")); diff != "" {
				t.Errorf("%s stream=%v: Requests() (-want +got):\n%s", api, stream, diff)
			}
		}
	}
}

// Down hangs up and takes the server down: later connections are refused
// for real, for every model.
func TestDown(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", Answer("before"), Down())
	s.Script("other", Answer("never"))
	c := newClient(t)
	if got := call(t, c, s, "openai", "m", false); got.err != nil || got.status() != 200 {
		t.Fatalf("before: status %d, err %v; want 200", got.status(), got.err)
	}
	if got := call(t, c, s, "openai", "m", true); got.resp != nil || !errors.Is(got.err, io.EOF) {
		t.Errorf("down: response %v, err %v; want no response and io.EOF", got.resp, got.err)
	}
	for _, model := range []string{"m", "other"} {
		if got := call(t, c, s, "anthropic", model, false); !errors.Is(got.err, syscall.ECONNREFUSED) {
			t.Errorf("%s after down: err = %v, want ECONNREFUSED", model, got.err)
		}
	}
	want := []Request{{Model: "m", API: "openai", N: 1, Step: "answer"}, {Model: "m", API: "openai", Stream: true, N: 2, Step: "down"}}
	if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header", "Usage")); diff != "" {
		t.Errorf("Requests() (-want +got):\n%s", diff)
	}
}

// Down after a delay takes the server down even when the client gave up
// waiting for it.
func TestDownAfterClientLeft(t *testing.T) {
	t.Parallel()
	s, tr := traceServer(t)
	s.Script("m", Down().After(time.Hour))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- send(ctx, newClient(t), s, paths["openai"], requestBody("openai", "m", false)).err }()
	waitFor(t, tr.arrived, "request")
	cancel()
	waitFor(t, tr.ended, "end of the handler")
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client: err = %v, want context.Canceled", err)
	}
	if _, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after the delayed Down: err = %v, want ECONNREFUSED", err)
	}
}

// GoDown refuses every later request, even from a client that pools its
// connections: the server keeps none open between requests.
func TestGoDownRefuses(t *testing.T) {
	t.Parallel()
	// The race this guards against (a pooled connection reused just after
	// the server closed it) is lost some of the time, so try it often.
	for i := range 20 {
		s := newServer(t)
		s.Script("m", Answer("hi"))
		c := newClient(t)
		first := call(t, c, s, "openai", "m", false)
		if first.err != nil || first.resp.Close != true {
			t.Fatalf("try %d: first request: err %v, Connection: close %v; want no error, true", i, first.err, first.resp.Close)
		}
		s.GoDown()
		s.GoDown() // twice is fine
		if got := call(t, c, s, "anthropic", "m", true); !errors.Is(got.err, syscall.ECONNREFUSED) {
			t.Fatalf("try %d: request after GoDown: err = %v, want ECONNREFUSED", i, got.err)
		}
		s.Close()
		s.GoDown() // and after Close too
	}
}

// A request already on its way when the server goes down (its connection
// accepted, its body not yet read) is logged as "down" and hung up on,
// whatever its body.
func TestGoDownMidRequest(t *testing.T) {
	t.Parallel()
	s, tr := traceServer(t)
	addr := strings.TrimPrefix(s.URL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tr.started, "the handler")
	s.GoDown()
	if _, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after GoDown: err = %v, want ECONNREFUSED", err)
	}
	// The rest of the body, which is not even JSON.
	if _, err := conn.Write([]byte(`"model":"m"]`)); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(conn); len(got) != 0 || err != nil {
		t.Errorf("read %q, err %v; want the connection closed without a response", got, err)
	}
	want := []Request{{API: "anthropic", N: 1, Step: "down"}}
	if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header")); diff != "" {
		t.Errorf("Requests() (-want +got):\n%s", diff)
	}
}

// The steps that wait without end are released by the client going away
// and by Close; either way the handler returns and the client gets an
// error, not an answer.
func TestStallsEnd(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		step   Step
		stream bool
		chunks int // text chunks the client reads before the stall
	}{
		{"stall_headers", StallHeaders(), true, -1},
		{"stall_headers_json", StallHeaders(), false, -1},
		{"stream_stall", StreamStall(2), true, 2},
		{"stream_stall_0", StreamStall(0), true, 0},
		{"stream_stall_json", StreamStall(2), false, 0},
		{"after", Answer("late").After(time.Hour), true, -1},
		{"every", Answer("one two three").Every(time.Hour), true, 1},
	}
	for _, tc := range tests {
		for _, by := range []string{"cancel", "close"} {
			t.Run(tc.name+"_by_"+by, func(t *testing.T) {
				t.Parallel()
				s, tr := traceServer(t)
				s.Script("m", tc.step)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				errc := make(chan error, 1)
				headers := make(chan struct{})
				go func() { errc <- stallingRequest(ctx, newClient(t), s, tc.stream, tc.chunks, headers) }()

				waitFor(t, tr.arrived, "request")
				if tc.chunks >= 0 {
					// The client has the status line and its chunks: the
					// server is in the stall now.
					<-headers
				}
				switch by {
				case "cancel":
					cancel()
					waitFor(t, tr.ended, "end of the handler after the client went away")
				case "close":
					s.Close()
					// Close returns only after the handler has: its end is
					// already reported.
					select {
					case <-tr.ended:
					default:
						t.Errorf("Close returned before the handler did")
					}
				}
				select {
				case err := <-errc:
					if err == nil {
						t.Errorf("client got a complete answer, want an error")
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("client still waiting 5s after the stall ended")
				}
			})
		}
	}
}

// stallingRequest sends an OpenAI request and reads chunks text chunks (or
// none, when chunks is negative, not even the headers); then it signals
// headers and reads on. It returns the error that ended the exchange.
func stallingRequest(ctx context.Context, c *http.Client, s *Server, stream bool, chunks int, headers chan<- struct{}) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+paths["openai"], strings.NewReader(requestBody("openai", "m", stream)))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if stream {
		for i := 0; i < chunks+1; i++ { // the role chunk, then the text chunks
			if _, err := r.ReadString('\n'); err != nil {
				return err
			}
			if _, err := r.ReadString('\n'); err != nil {
				return err
			}
		}
	}
	close(headers)
	_, err = io.ReadAll(r)
	if err == nil {
		return nil
	}
	return err
}

// After delays the response and Every spaces the chunks by at least their
// durations; Every does nothing to a JSON answer.
func TestDelays(t *testing.T) {
	t.Parallel()
	const d = 30 * time.Millisecond
	s := newServer(t)
	c := newClient(t)

	s.Script("after", Answer("hi").After(d))
	start := time.Now()
	got := call(t, c, s, "anthropic", "after", false)
	if elapsed := time.Since(start); got.err != nil || elapsed < d {
		t.Errorf("After(%v): answered in %v, err %v; want at least %v", d, elapsed, got.err, d)
	}

	// Three chunks, two waits between them.
	s.Script("every", Answer("a b c").Every(d))
	start = time.Now()
	got = call(t, c, s, "openai", "every", true)
	if elapsed := time.Since(start); got.err != nil || elapsed < 2*d {
		t.Errorf("Every(%v): streamed in %v, err %v; want at least %v", d, elapsed, got.err, 2*d)
	}

	// Every on a JSON answer would otherwise hold the response for hours.
	s.Script("json", Answer("a b c").Every(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if got := send(ctx, c, s, paths["openai"], requestBody("openai", "json", false)); got.err != nil || got.status() != 200 {
		t.Errorf("Every on JSON: status %d, err %v; want an answer at once", got.status(), got.err)
	}

	// Negative durations are no wait.
	s.Script("negative", Answer("a b").After(-time.Hour).Every(-time.Hour))
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if got := send(ctx, c, s, paths["anthropic"], requestBody("anthropic", "negative", true)); got.err != nil || got.status() != 200 {
		t.Errorf("negative delays: status %d, err %v; want an answer at once", got.status(), got.err)
	}
}
