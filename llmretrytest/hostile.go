package llmretrytest

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// Conns returns how many connections to the server are open: accepted and
// not yet closed. The server closes a connection once its response is
// done, or once it notices that the client went away: at once for a
// response that is waiting or stalled, at its next write for one being
// sent. A test that ends a client's request can wait for Conns to reach 0
// to see that the client let go of its connection rather than leaving it
// open. Conns is 0 after [Server.Close].
func (s *Server) Conns() int { return int(s.open.Load()) }

// fillBlock is how much of a filled body is written at a time: a
// gigabyte-long body costs the server one block.
const fillBlock = 32 << 10

// fillMark stands for the text in an answer rendered to find where the
// text goes. It is plain ASCII, so JSON keeps it as it is.
const fillMark = "llmretrytest-fill-mark"

// fill plays HugeBody, EndlessBody and Trickle: the answer up to its text,
// then x bytes, then, for HugeBody, the rest of the answer. It reports
// false when the client went away or the server closed, so that the
// connection is cut.
func (x *exchange) fill(ep *endpoint, st Step) bool {
	prefix, suffix := x.envelope(ep)
	if x.req.Stream {
		x.w.Header().Set("Cache-Control", "no-cache")
		x.header(&st, "text/event-stream; charset=utf-8")
	} else {
		x.header(&st, "application/json")
		if st.kind == kindHugeBody {
			// A client can see from Content-Length how much is coming, and
			// refuse it before reading.
			n := int64(len(prefix)) + st.size + int64(len(suffix))
			x.w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
	}
	x.w.WriteHeader(http.StatusOK)
	if !x.send(prefix) {
		return false
	}
	if st.kind == kindTrickle {
		one := []byte{'x'}
		for x.wait(st.every) && x.ctx.Err() == nil {
			if !x.send(one) {
				return false
			}
		}
		return false
	}
	block := bytes.Repeat([]byte{'x'}, fillBlock)
	left := st.size
	for i := 0; st.kind == kindEndlessBody || left > 0; i++ {
		// A client that reads as fast as the server writes never makes a
		// write fail; the checks stop the loop when it goes away or the
		// server closes.
		if (i > 0 && !x.wait(st.every)) || x.ctx.Err() != nil {
			return false
		}
		b := block
		if st.kind == kindHugeBody && left < int64(len(b)) {
			b = b[:left]
		}
		if !x.send(b) {
			return false
		}
		left -= int64(len(b))
	}
	return x.send(suffix)
}

// send writes b and flushes it, and reports false when the client is gone.
func (x *exchange) send(b []byte) bool {
	if _, err := x.w.Write(b); err != nil {
		return false
	}
	return x.flush()
}

// envelope is the body of an answer cut where its text goes: prefix
// before the text, suffix after it. It renders a one-word answer with
// the provider's own code, so a filled body reads as any answer does up to
// its text, and, for HugeBody, after it.
func (x *exchange) envelope(ep *endpoint) (prefix, suffix []byte) {
	var body []byte
	if x.req.Stream {
		rec := &recorder{}
		y := *x
		y.w = rec
		ep.stream(&y, Answer(fillMark)) // no waits, and a recorder never fails
		body = rec.body.Bytes()
	} else {
		body = ep.json(x, Answer(fillMark))
	}
	// The text is the last string in both providers' answers, after the
	// model name, which might hold the mark too.
	i := bytes.LastIndex(body, []byte(fillMark))
	return body[:i], body[i+len(fillMark):]
}

// recorder is a ResponseWriter that keeps the body in memory, for
// rendering a stream's events.
type recorder struct {
	header http.Header
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header {
	if r.header == nil {
		r.header = make(http.Header)
	}
	return r.header
}

func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(int)             {}
func (r *recorder) Flush()                      {}

// partialHeaders plays PartialHeaders. net/http writes whole header
// blocks, so it takes the connection over and writes to it directly.
func (x *exchange) partialHeaders() {
	// A hijacked connection is no longer the server's: count it here, while
	// its own count still holds Close's wait, so that Close waits for this
	// handler too.
	x.s.conns.Add(1)
	defer x.s.conns.Done()
	conn, _, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // not HTTP/1: cut it without a response
	}
	defer x.s.open.Add(-1)
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: applic"); err != nil {
		return
	}
	// The request was read whole, so a read ends only when the client
	// closes the connection, or when Close does.
	stop, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-x.s.done:
			_ = conn.Close()
		case <-stop:
		}
	}()
	_, _ = io.Copy(io.Discard, conn)
	close(stop)
	<-exited
}
