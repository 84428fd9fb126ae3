package llmretrytest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// settledConns waits until the server counts want open connections, for
// a bound far above what noticing a closed connection takes, and returns
// the count it saw last.
func settledConns(s *Server, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	n := s.Conns()
	for n != want && time.Now().Before(deadline) {
		runtime.Gosched()
		n = s.Conns()
	}
	return n
}

// ignoreCreated leaves out OpenAI's created time, which two requests a
// second apart do not share.
var ignoreCreated = cmpopts.IgnoreMapEntries(func(k string, _ any) bool { return k == "created" })

// HugeBody's body is exactly the answer whose text is n x's, made on the
// fly: for JSON with its Content-Length, for a stream event for event.
func TestHugeBody(t *testing.T) {
	t.Parallel()
	const n = 3*fillBlock + 123 // more than a block, and not a whole number of them
	text := strings.Repeat("x", n)
	for _, api := range []string{"openai", "anthropic"} {
		for _, stream := range []bool{false, true} {
			t.Run(api+"_"+strconv.FormatBool(stream), func(t *testing.T) {
				t.Parallel()
				huge, plain := newServer(t), newServer(t)
				huge.Script("m", HugeBody(n).WithHeader("x-extra", "1"))
				plain.Script("m", Answer(text).WithHeader("x-extra", "1"))
				c := newClient(t)
				got, want := call(t, c, huge, api, "m", stream), call(t, c, plain, api, "m", stream)
				if got.err != nil || want.err != nil {
					t.Fatalf("HugeBody: %v; Answer: %v", got.err, want.err)
				}
				if got.status() != http.StatusOK {
					t.Errorf("status = %d, want 200", got.status())
				}
				for _, key := range []string{"Content-Type", "X-Extra", "Cache-Control"} {
					if g, w := got.resp.Header.Get(key), want.resp.Header.Get(key); g != w {
						t.Errorf("%s = %q, want %q as an answer has", key, g, w)
					}
				}
				if stream {
					if diff := cmp.Diff(parseSSE(t, want.body), parseSSE(t, got.body), ignoreCreated); diff != "" {
						t.Errorf("events (-want +got):\n%s", diff)
					}
					return
				}
				if got.resp.ContentLength != int64(len(got.body)) {
					t.Errorf("Content-Length = %d, body has %d bytes", got.resp.ContentLength, len(got.body))
				}
				if diff := cmp.Diff(decode(t, want.body), decode(t, got.body), ignoreCreated); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// A gigabyte promised is a gigabyte announced, but only sent as the client
// reads it: a client that reads a little and lets go ends the response.
func TestHugeBodyGigabyte(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", HugeBody(1<<30))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+paths["openai"], strings.NewReader(requestBody("openai", "m", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength <= 1<<30 {
		t.Errorf("Content-Length = %d, want more than 1 GiB", resp.ContentLength)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	resp.Body.Close()
	if err != nil || len(b) != 4<<20 {
		t.Fatalf("read %d bytes, err %v; want 4 MiB", len(b), err)
	}
	if !bytes.HasPrefix(b, []byte(`{"id":"chatcmpl-m-1",`)) || bytes.Count(b[1<<20:], []byte("x")) != 3<<20 {
		t.Errorf("body starts %q, then not only x", b[:100])
	}
	if n := settledConns(s, 0); n != 0 {
		t.Errorf("Conns() = %d after the client closed the body, want 0", n)
	}
}

// readUntil reads r until the bytes read end with suffix, and returns
// them with the time each byte arrived. It gives up after 1 MiB: the
// bodies it reads may never end.
func readUntil(r io.Reader, suffix string) ([]byte, []time.Time, error) {
	var got []byte
	var at []time.Time
	buf := make([]byte, 1)
	for !bytes.HasSuffix(got, []byte(suffix)) {
		if len(got) >= 1<<20 {
			return got, at, errors.New("no " + strconv.Quote(suffix) + " in 1 MiB")
		}
		n, err := r.Read(buf)
		now := time.Now()
		for range n {
			at = append(at, now)
		}
		got = append(got, buf[:n]...)
		if err != nil {
			return got, at, err
		}
	}
	return got, at, nil
}

// post sends a minimal request for model and returns the response, which
// the test closes.
func post(t *testing.T, s *Server, api, model string, stream bool) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+paths[api], strings.NewReader(requestBody(api, model, stream)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := newClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// textStart is how the body of each API and mode reads just before the
// answer's text: a filled body is an answer up to there.
var textStart = map[string]string{
	"openai_false":    `"message":{"role":"assistant","content":"`,
	"openai_true":     `"choices":[{"index":0,"delta":{"content":"`,
	"anthropic_false": `"content":[{"type":"text","text":"`,
	"anthropic_true":  `"delta":{"type":"text_delta","text":"`,
}

// EndlessBody sends x for as long as the client reads, and ends when the
// client lets go.
func TestEndlessBody(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"openai", "anthropic"} {
		for _, stream := range []bool{false, true} {
			name := api + "_" + strconv.FormatBool(stream)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := newServer(t)
				s.Script("m", EndlessBody())
				resp := post(t, s, api, "m", stream)
				if resp.ContentLength != -1 {
					t.Errorf("Content-Length = %d, want none", resp.ContentLength)
				}
				head, _, err := readUntil(resp.Body, textStart[name])
				if err != nil {
					t.Fatalf("reading to the text: %v", err)
				}
				// 3 MiB, far more than any buffer on the way, all x.
				b, err := io.ReadAll(io.LimitReader(resp.Body, 3<<20))
				if err != nil || len(b) != 3<<20 || bytes.Count(b, []byte("x")) != len(b) {
					t.Errorf("read %d bytes (%d of them x), err %v; want 3 MiB of x", len(b), bytes.Count(b, []byte("x")), err)
				}
				if stream && bytes.Contains(head[bytes.LastIndexByte(head, '\n'):], []byte("data: ")) == false {
					t.Errorf("the text is not on a data line: %q", head)
				}
				resp.Body.Close()
				if n := settledConns(s, 0); n != 0 {
					t.Errorf("Conns() = %d after the client let go, want 0", n)
				}
			})
		}
	}
}

// Trickle sends its text one byte an interval, and never completes the
// event that holds it.
func TestTrickle(t *testing.T) {
	t.Parallel()
	const every = 10 * time.Millisecond
	for _, api := range []string{"openai", "anthropic"} {
		for _, stream := range []bool{false, true} {
			name := api + "_" + strconv.FormatBool(stream)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := newServer(t)
				s.Script("m", Trickle(every))
				start := time.Now()
				resp := post(t, s, api, "m", stream)
				got, at, err := readUntil(resp.Body, textStart[name]+"xxxxx")
				if err != nil {
					t.Fatalf("reading the first five bytes of text: %v", err)
				}
				// Each byte waits its interval, so the fifth is sent at
				// least five intervals after the request: a lower bound
				// that neither a slow server nor a slow client can break.
				// (The spacing between bytes as read is no bound: a client
				// held up reads five waiting bytes at once.)
				if d := at[len(at)-1].Sub(start); d < 5*every {
					t.Errorf("five bytes of text came %v after the request, want at least %v", d, 5*every)
				}
				if stream {
					line := got[bytes.LastIndexByte(got, '\n')+1:]
					if !bytes.HasPrefix(line, []byte("data: ")) {
						t.Errorf("the text is not on an open data line: %q", line)
					}
				}
				resp.Body.Close()
				if n := settledConns(s, 0); n != 0 {
					t.Errorf("Conns() = %d after the client let go, want 0", n)
				}
				want := []Request{{Model: "m", API: api, Stream: stream, N: 1, Step: "trickle"}}
				if diff := cmp.Diff(want, s.Requests(), cmpopts.IgnoreFields(Request{}, "Time", "Header")); diff != "" {
					t.Errorf("Requests() (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// PartialHeaders sends half a header and then waits: a client sees
// exactly those bytes, and an HTTP client's request waits until its own
// deadline.
func TestPartialHeaders(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.Script("m", PartialHeaders().WithHeader("retry-after", "1"))

	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := requestBody("openai", "m", false)
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	const want = "HTTP/1.1 200 OK\r\nContent-Type: applic"
	got, _, err := readUntil(conn, want)
	if err != nil || string(got) != want {
		t.Errorf("read %q, err %v; want %q", got, err, want)
	}
	if n := s.Conns(); n != 1 {
		t.Errorf("Conns() = %d while the headers hang, want 1", n)
	}
	conn.Close()
	if n := settledConns(s, 0); n != 0 {
		t.Errorf("Conns() = %d after the client closed, want 0", n)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if got := send(ctx, newClient(t), s, paths["anthropic"], requestBody("anthropic", "m", true)); !errors.Is(got.err, context.DeadlineExceeded) {
		t.Errorf("HTTP client: err = %v, want context.DeadlineExceeded", got.err)
	}
	if n := settledConns(s, 0); n != 0 {
		t.Errorf("Conns() = %d after the HTTP client gave up, want 0", n)
	}
}

// Conns counts connections from accept to close, whatever ends them.
func TestConns(t *testing.T) {
	t.Parallel()
	s, tr := traceServer(t)
	s.Script("ok", Answer("hi"))
	s.Script("stall", StallHeaders())
	if n := s.Conns(); n != 0 {
		t.Errorf("Conns() = %d before any request, want 0", n)
	}
	c := newClient(t)
	if got := call(t, c, s, "openai", "ok", false); got.err != nil {
		t.Fatal(got.err)
	}
	waitFor(t, tr.ended, "end of the answer")
	if n := settledConns(s, 0); n != 0 {
		t.Errorf("Conns() = %d after an answer (the server closes each connection), want 0", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(ctx, c, s, paths["openai"], requestBody("openai", "stall", false))
	}()
	waitFor(t, tr.arrived, "the ok request")
	waitFor(t, tr.arrived, "the stalled request")
	if n := s.Conns(); n != 1 {
		t.Errorf("Conns() = %d during a stall, want 1", n)
	}
	cancel()
	<-done
	if n := settledConns(s, 0); n != 0 {
		t.Errorf("Conns() = %d after the client cancelled, want 0", n)
	}
}

// Conns reads 0 as soon as Close returns, with no settling: Close waits
// until every connection is counted closed, not only until its goroutine
// is done.
func TestConnsZeroOnceClosed(t *testing.T) {
	t.Parallel()
	for i := range 300 {
		s := NewServer()
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		if n := settledConns(s, 1); n != 1 {
			s.Close()
			c.Close()
			t.Fatalf("round %d: Conns() = %d with one connection open, want 1", i, n)
		}
		s.Close()
		n := s.Conns()
		c.Close()
		if n != 0 {
			t.Fatalf("round %d: Conns() = %d when Close returned, want 0", i, n)
		}
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r  io.Reader
	mu sync.Mutex
	n  int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.n += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *countingReader) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// zeros is an endless source of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A Blackhole takes connections and answers nothing: a request waits for
// its deadline, and a large body blocks in its write once the buffers
// fill.
func TestBlackhole(t *testing.T) {
	t.Parallel()
	b := NewBlackhole()
	defer b.Close()
	const size = 256 << 20
	body := &countingReader{r: io.LimitReader(zeros{}, size)}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	resp, err := newClient(t).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do() = %v, want context.DeadlineExceeded", err)
	}
	if n := body.count(); n >= size {
		t.Errorf("the client sent all %d bytes of its body; want its write blocked", n)
	} else {
		t.Logf("sent %d of %d bytes before the deadline", n, size)
	}
	// The kernel completes a connection before the accept loop takes it:
	// give a loaded machine time to run that loop.
	for deadline := time.Now().Add(5 * time.Second); b.Accepted() == 0 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	if n := b.Accepted(); n != 1 {
		t.Errorf("Accepted() = %d, want 1", n)
	}
	b.Close()
	b.Close() // a second Close does nothing
	if _, err := net.Dial("tcp", strings.TrimPrefix(b.URL, "http://")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after Close: err = %v, want ECONNREFUSED", err)
	}
}

// Close ends the new steps' endless responses and the Blackhole's
// connections, and leaves no goroutine behind. The test is not parallel,
// so the only servers running are its own.
func TestCloseEndsHostileSteps(t *testing.T) {
	if left := settledServerGoroutines(); len(left) > 0 {
		t.Fatalf("server goroutines before the test (another test leaked):\n%s", strings.Join(left, "\n\n"))
	}
	// A handler that missed the close would hold Close for good: the test
	// must fail rather than hang, in its body and in its cleanup.
	s := NewServer()
	tr := traceOf(s)
	closeWithin := func() bool {
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			s.Close()
		}()
		select {
		case <-closed:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	t.Cleanup(func() { closeWithin() })
	s.Script("partial", PartialHeaders())
	s.Script("trickle", Trickle(time.Hour))
	s.Script("endless", EndlessBody().Every(time.Hour))
	s.Script("huge", HugeBody(1<<30).Every(time.Hour))
	b := NewBlackhole()
	t.Cleanup(b.Close)
	c := newClient(t)
	var wg sync.WaitGroup
	for _, model := range []string{"partial", "trickle", "endless", "huge"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(context.Background(), c, s, paths["openai"], requestBody("openai", model, true))
		}()
		waitFor(t, tr.arrived, model)
	}
	blackholed := make(chan error, 1)
	go func() {
		resp, err := c.Post(b.URL+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
		}
		blackholed <- err
	}()
	// Bounded, like every wait here: a request that never reaches the
	// Blackhole must fail the test, not spin until the test binary's
	// timeout.
	for deadline := time.Now().Add(5 * time.Second); b.Accepted() == 0; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the Blackhole accepted no connection within 5s")
		}
	}
	if !closeWithin() {
		t.Fatal("Close did not return within 5s")
	}
	if n := len(tr.ended); n != 4 {
		t.Errorf("%d handlers had ended when Close returned, want 4", n)
	}
	if n := s.Conns(); n != 0 {
		t.Errorf("Conns() = %d after Close, want 0", n)
	}
	wg.Wait()
	b.Close()
	if err := <-blackholed; err == nil {
		t.Error("request to a closed Blackhole succeeded")
	}
	left := settledGoroutines(func(g string) bool {
		return strings.Contains(g, "llmretrytest.(*Blackhole)") || isServerGoroutine(g)
	})
	if len(left) > 0 {
		t.Errorf("%d goroutines left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}
