package llmretrytest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxBody caps a request body. Real prompts stay far below it; a client
// that sends more gets a 413 rather than making the server hold it all.
const maxBody = 10 << 20

// Server is a scripted LLM provider listening on 127.0.0.1: it answers
// OpenAI Chat Completions at POST /v1/chat/completions, Anthropic
// Messages at POST /v1/messages, OpenAI's Responses API at POST
// /v1/responses and the Gemini API at POST
// /v1beta/models/{model}:generateContent and :streamGenerateContent, each
// request with the next [Step] of its model's script. Create one with
// [NewServer] and end it with
// [Server.Close]; the zero Server is not usable. Its methods are safe for
// concurrent use, also while requests are being served.
type Server struct {
	// URL is the server's base URL, "http://127.0.0.1:PORT", with no
	// trailing slash.
	URL string

	ln     net.Listener
	srv    *http.Server
	served chan struct{}  // closed when Serve has returned
	conns  sync.WaitGroup // one count per connection, until its goroutine is done with it
	open   atomic.Int64   // connections accepted and not yet closed, for Conns
	done   chan struct{}  // closed by Close: ends every stall and delay

	closeOnce sync.Once
	downOnce  sync.Once

	mu      sync.Mutex
	scripts map[string]*script
	counts  map[string]int // requests per model, for Request.N
	log     []Request
	down    bool
	limits  map[string]*limiter // by model, as Limit sets them
	// background holds the Responses API responses run in the
	// background, by id, for their streams to be resumed.
	background map[string]*backgroundResponse
	// now, when set by an in-package test, is the clock the server reads
	// for Request.Time and its buckets, so refill can be tested in a time
	// of the test's own; nil is time.Now.
	now func() time.Time
	// trace, when set by an in-package test, sees each request when its
	// handler starts ("start", before the body is read, so with an empty
	// Request), when it is logged ("arrive") and when its handler returns
	// ("end").
	trace func(event string, r Request)
}

// script is one model's steps and the position of the next one to play.
type script struct {
	steps []Step
	next  int
}

// Request is the server's record of one request it received, as
// [Server.Requests] returns it.
type Request struct {
	Model  string    // the request body's "model" (Gemini's: the path's); "" when the body could not be decoded
	API    string    // "openai", "openai-responses", "anthropic" or "gemini"
	Stream bool      // the request asked for a stream ("stream": true, or Gemini's :streamGenerateContent)
	Time   time.Time // when the server had read the request and chose its step
	N      int       // 1-based count of requests for this model, this one included
	// Step is what the server played, as [Step.String] names it; or
	// "status 404" for a model with no script, "status 400" or
	// "status 413" for a body the server could not use, "down" for a
	// request that reached a server already down, and "status 429
	// requests" or "status 429 tokens" for one its model's limits
	// refused ([Server.Limit]).
	Step string
	// Header is a copy of the request's header as the server read it,
	// as http.Request.Header holds it: keys canonical, and Host not among
	// them. A client can mark each request with a header of its own (an
	// attempt's id, say) to match the log with what it sent. Requests
	// returns a fresh copy each time, so changing it changes no log. It
	// keeps credentials as the client sent them (Authorization,
	// x-api-key): a test that prints it prints its test key.
	Header http.Header
	// Usage is the usage the response told the client: a JSON answer's
	// usage block, once the whole body was written, or a stream's last
	// usage event written so far. It is nil when the client was told
	// none: an error status, a connection cut or a stall before the
	// usage was sent, an OpenAI stream without
	// stream_options.include_usage, and the hostile bodies ([HugeBody],
	// [EndlessBody], [Trickle]), whose usage is not logged. A test sums
	// it to check what its client says the requests cost.
	Usage *Usage
	// Continues is the text the request asked the model to continue: an
	// Anthropic assistant prefill, a Chat Completions assistant message
	// sent with "prefix": true or with continue_final_message, or, for a
	// background response resumed after a sequence number, the text its
	// stream had sent up to it. It is empty for a request that asked for
	// a new answer.
	Continues string
}

// NewServer starts a Server listening on a free port of 127.0.0.1. No
// model has a script yet. It panics if it cannot listen, as
// httptest.NewServer does: a test cannot go on without its server.
func NewServer() *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("llmretrytest: failed to listen on a port: " + err.Error())
	}
	s := &Server{
		URL:     "http://" + ln.Addr().String(),
		ln:      ln,
		served:  make(chan struct{}),
		done:    make(chan struct{}),
		scripts: make(map[string]*script),
		counts:  make(map[string]int),
	}
	s.srv = &http.Server{
		Handler: http.HandlerFunc(s.handle),
		// The server's own complaints (a client that hung up mid-write)
		// are expected in tests of failures; they would only be noise.
		ErrorLog: log.New(io.Discard, "", 0),
		// Counting connections lets Close wait until every connection's
		// goroutine is done with its handler. StateNew runs on the Serve
		// goroutine, so no Add can race with Close's Wait, which comes
		// after Serve has returned.
		ConnState: func(c net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew:
				s.conns.Add(1)
				s.open.Add(1)
			case http.StateClosed:
				// Uncounted before Done, so that Conns reads 0 once
				// Close's Wait has returned.
				s.open.Add(-1)
				s.conns.Done()
			case http.StateHijacked:
				s.conns.Done() // the step that hijacked it counts it open until it closes it
			}
		},
	}
	// One connection per request. A client that pools connections would
	// otherwise, for a moment after GoDown, send its next request on a
	// connection the server has just closed, and get a broken pipe or a
	// reset where a refused connection was scripted; and a connection
	// dropped by Hangup could be one the client reused, which net/http
	// may resend a request on. Loopback connections cost microseconds.
	s.srv.SetKeepAlivesEnabled(false)
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln) // returns when the listener is closed, by GoDown or Close
	}()
	return s
}

// OpenAIBaseURL returns the base URL to give openai-go's
// option.WithBaseURL: URL + "/v1/".
func (s *Server) OpenAIBaseURL() string { return s.URL + "/v1/" }

// AnthropicBaseURL returns the base URL to give anthropic-sdk-go's
// option.WithBaseURL: URL + "/".
func (s *Server) AnthropicBaseURL() string { return s.URL + "/" }

// Script sets the steps that model's requests play, replacing any script
// it had: the next request for model plays steps[0], the one after
// steps[1], and so on; once the steps run out the last one repeats, so a
// one-step script plays forever. Request.N keeps counting across scripts.
// Script with no steps removes the model's script, and its requests get a
// 404 again. The server keeps its own copy of steps.
func (s *Server) Script(model string, steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(steps) == 0 {
		delete(s.scripts, model)
		return
	}
	s.scripts[model] = &script{steps: slices.Clone(steps)}
}

// Requests returns a copy of the log of requests received so far, in the
// order the server read them, which is also the order of their Time. Only
// POSTs to the two endpoints are logged, and only once their body has
// been read: a client that gave up while sending is not.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	reqs := slices.Clone(s.log)
	for i := range reqs {
		reqs[i].Header = reqs[i].Header.Clone() // a map: the copy must not share it
		if u := reqs[i].Usage; u != nil {
			c := *u
			reqs[i].Usage = &c
		}
	}
	return reqs
}

// GoDown takes the server down as a provider outage does: it stops
// listening, so later requests are refused (ECONNREFUSED). Responses
// already under way finish. A request whose connection was accepted
// before GoDown but whose body had not yet been read is logged as "down"
// and its connection is closed without a response. A server that is down
// stays down. GoDown may be called more than once, and after Close.
func (s *Server) GoDown() {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	s.downOnce.Do(func() { _ = s.ln.Close() })
}

// Close shuts the server down: it ends every stall and delay, closes the
// listener and every connection, cutting off responses under way, and
// returns once every handler has returned and every connection is closed,
// so a test that closes its server leaks no goroutine. Close may be
// called more than once, also after GoDown; Requests still works after
// it.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		_ = s.srv.Close() // closes the listener and all connections, so no read blocks a handler
		<-s.served
		s.conns.Wait()
	})
}

// endpoint is one provider's API as the server speaks it.
type endpoint struct {
	name      string // Request.API
	requestID string // the response header carrying the request id
	// errorBody encodes an error in the provider's shape; a provider
	// without codes or params ignores them.
	errorBody func(status int, errType, code, param, message string) []byte
	// errorFor chooses the type, code, param and message of an error
	// response with status, or of st when the step has its own
	// (InsufficientQuota, ContextLengthExceeded, StreamError); model is
	// named by a 404.
	errorFor func(status int, st Step, model string) (errType, code, param, message string)
	// json encodes the complete JSON answer for st.
	json func(x *exchange, st Step) []byte
	// stream writes st as an SSE stream; it returns false if the client
	// went away or the server closed, so that the connection is cut.
	stream func(x *exchange, st Step) bool
}

// exchange is one request being answered.
type exchange struct {
	s            *Server
	w            http.ResponseWriter
	ctx          context.Context
	req          Request
	id           string // request id, "req_<model>_<N>"
	requestID    string // the header that carries id
	includeUsage bool   // OpenAI stream_options.include_usage
	logged       int    // the index of req in the server's log, for sendingUsage

	continues  string              // the text the request asks to continue; "" for a new answer
	mismatch   bool                // the scripted answer does not begin with continues
	background bool                // a Responses API stream run in the background, to be resumed
	resumed    *backgroundResponse // the background response a resumption streams; nil otherwise
}

// incoming is the part of a request body the server reads.
type incoming struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// For continuation: the conversation's messages (Chat Completions,
	// Anthropic), vLLM's continue_final_message, and the Responses API's
	// background.
	Messages             []message `json:"messages"`
	ContinueFinalMessage bool      `json:"continue_final_message"`
	Background           bool      `json:"background"`
}

// handle serves one request. It never panics but with http.ErrAbortHandler,
// which is how net/http lets a handler cut its connection without a
// response; the server recovers it without logging.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	s.traceEvent("start", Request{})
	var ep *endpoint
	// Gemini names the model, and whether to stream, in the path.
	pathModel, pathStream, isGemini := geminiPath(r.URL.Path)
	switch {
	case r.URL.Path == "/v1/chat/completions":
		ep = &openAI
	case r.URL.Path == "/v1/messages":
		ep = &anthropic
	case r.URL.Path == "/v1/responses":
		ep = &responsesAPI
	case strings.HasPrefix(r.URL.Path, "/v1/responses/") && r.Method == http.MethodGet:
		// A background response's stream, resumed.
		s.resume(w, r, strings.TrimPrefix(r.URL.Path, "/v1/responses/"))
		return
	case isGemini:
		ep = &gemini
	default:
		// Neither SDK sends this. It is not logged: the log is of
		// requests to a model, and this names none.
		writeError(w, &openAI, nil, http.StatusNotFound, "invalid_request_error", "", "", "unknown path "+r.URL.Path, "")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, ep, nil, http.StatusMethodNotAllowed, "invalid_request_error", "", "", "method "+r.Method+" not allowed; use POST", "")
		return
	}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	status := 0
	var in incoming
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		status = http.StatusRequestEntityTooLarge
	case err != nil:
		return // the client went away mid-body, or broke its framing: no one to answer
	case json.Unmarshal(body, &in) != nil:
		status = http.StatusBadRequest
		in = incoming{} // a half-decoded body names nothing reliable
	case isGemini:
		in.Model, in.Stream = pathModel, pathStream
	case in.Model == "":
		status = http.StatusBadRequest
	}

	x := &exchange{s: s, w: w, ctx: r.Context(), requestID: ep.requestID, includeUsage: in.StreamOptions != nil && in.StreamOptions.IncludeUsage}
	var problem string // why a continuation is refused
	if status == 0 {
		x.continues, problem = continuation(ep, &in)
		if problem != "" {
			status = http.StatusBadRequest
		}
		x.background = in.Background && in.Stream && ep == &responsesAPI
	}
	defer func() { s.traceEvent("end", x.req) }()
	st, ok := s.arrive(x, ep, in, status, r.Header.Clone())
	switch {
	case status != 0:
		msg := "could not decode the request body as JSON"
		switch {
		case problem != "":
			msg = problem
		case status == http.StatusRequestEntityTooLarge:
			msg = "request body larger than " + strconv.Itoa(maxBody) + " bytes"
		case err == nil && in.Model == "" && json.Valid(body):
			msg = "model: field required"
		}
		writeError(w, ep, nil, status, "", "", "", msg, x.id)
	case x.mismatch:
		writeError(w, ep, nil, http.StatusBadRequest, "invalid_request_error", "", "",
			"llmretrytest: asked to continue text that the scripted answer does not begin with", x.id)
	case !ok:
		errType, code, param, msg := ep.errorFor(http.StatusNotFound, Step{}, in.Model)
		writeError(w, ep, nil, http.StatusNotFound, errType, code, param, msg, x.id)
	default:
		s.play(x, ep, st)
	}
}

// arrive logs the request and picks its step: ok is false when the model
// has no script. A server that is down hangs up at once, whatever the
// request.
func (s *Server) arrive(x *exchange, ep *endpoint, in incoming, status int, h http.Header) (st Step, ok bool) {
	s.mu.Lock()
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	s.counts[in.Model]++
	n := s.counts[in.Model]
	down := s.down
	var name string
	switch sc := s.scripts[in.Model]; {
	case down:
		name = Down().String()
	case status != 0:
		name = statusName(status)
	case sc == nil:
		name = statusName(http.StatusNotFound)
	default:
		var admitted bool
		st, admitted = s.admit(in.Model, ep.name, sc.steps[min(sc.next, len(sc.steps)-1)], now)
		if admitted { // a request its limits refused never reached the model
			sc.next++
		}
		ok = true
		name = st.String()
		if x.continues != "" && x.resumed == nil {
			// The model goes on from the text it was given: the rest of
			// the scripted answer is what it says.
			var begins bool
			if st, begins = st.continuing(x.continues); !begins {
				x.mismatch, name = true, statusName(http.StatusBadRequest)
			}
		}
	}
	x.req = Request{Model: in.Model, API: ep.name, Stream: in.Stream, Time: now, N: n, Step: name, Header: h, Continues: x.continues}
	x.id = "req_" + idSafe(in.Model) + "_" + strconv.Itoa(n)
	x.logged = len(s.log)
	s.log = append(s.log, x.req)
	s.mu.Unlock()
	s.traceEvent("arrive", x.req)
	if down {
		panic(http.ErrAbortHandler)
	}
	return st, ok
}

func (s *Server) traceEvent(event string, r Request) {
	s.mu.Lock()
	trace := s.trace
	s.mu.Unlock()
	if trace != nil {
		trace(event, r)
	}
}

// idSafe keeps a model name usable in an id and a header value: letters,
// digits, '.', '-' and '_' stay, anything else becomes '_'.
func idSafe(model string) string {
	b := []byte(model)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// play answers with st.
func (s *Server) play(x *exchange, ep *endpoint, st Step) {
	if !x.wait(st.after) {
		if st.kind == kindDown {
			// The log says this request took the server down; a client
			// that gave up waiting must not cancel the outage.
			s.GoDown()
		}
		panic(http.ErrAbortHandler)
	}
	switch st.kind {
	case kindHangup:
		panic(http.ErrAbortHandler)
	case kindDown:
		s.GoDown()
		panic(http.ErrAbortHandler)
	case kindStallHeaders:
		x.stall()
		panic(http.ErrAbortHandler)
	case kindPartialHeaders:
		x.partialHeaders()
		return
	case kindHugeBody, kindEndlessBody, kindTrickle:
		if !x.fill(ep, st) {
			panic(http.ErrAbortHandler)
		}
		return
	case kindStatus, kindInsufficientQuota, kindContextLength, kindContentFilter:
		status := st.status
		switch st.kind {
		case kindInsufficientQuota:
			status = http.StatusTooManyRequests
		case kindContextLength, kindContentFilter:
			status = http.StatusBadRequest
		}
		errType, code, param, msg := ep.errorFor(status, st, x.req.Model)
		writeError(x.w, ep, &st, status, errType, code, param, msg, x.id)
		return
	}
	if st.kind == kindFailed && ep != &responsesAPI {
		st.kind = kindStreamError // only the Responses API has failed answers
	}
	if x.req.Stream {
		s.keepBackground(x, st)
		if !ep.stream(x, st) {
			panic(http.ErrAbortHandler)
		}
		return
	}
	s.playJSON(x, ep, st)
}

// playJSON answers a request that did not ask for a stream.
func (s *Server) playJSON(x *exchange, ep *endpoint, st Step) {
	// An answer that breaks partway breaks a JSON body as the steps that
	// break a stream do.
	switch st.fault {
	case faultDrop:
		st = st.plain()
		st.kind = kindStreamDrop
	case faultStall:
		st = st.plain()
		st.kind = kindStreamStall
	case faultGarble:
		st.kind = kindMalformed
	case faultError:
		st = StreamError(st.faultType)
	}
	switch st.kind {
	case kindStreamError:
		status := statusForType(st.errType)
		_, _, _, msg := ep.errorFor(status, st, x.req.Model)
		writeError(x.w, ep, &st, status, st.errType, "", "", msg, x.id)
		return
	case kindMalformed:
		body := ep.json(x, Answer("malformed"))
		x.header(&st, "application/json")
		x.w.WriteHeader(http.StatusOK)
		_, _ = x.w.Write(body[:len(body)/2])
		return
	}
	body := ep.json(x, st)
	x.header(&st, "application/json")
	x.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(http.StatusOK)
	switch st.kind {
	case kindStreamDrop:
		// Content-Length promises the whole body; cutting the connection
		// halfway makes the client's read fail with an unexpected EOF.
		_, _ = x.w.Write(body[:len(body)/2])
		x.flush()
		panic(http.ErrAbortHandler)
	case kindStreamStall:
		x.flush()
		x.stall()
		panic(http.ErrAbortHandler)
	}
	x.sendingUsage(answerUsage(st), func() bool {
		_, err := x.w.Write(body)
		return err == nil
	})
}

// statusForType is the HTTP status a provider's error type stands for, for
// a StreamError played to a request that did not ask for a stream.
func statusForType(errType string) int {
	switch errType {
	case "overloaded_error":
		return 529
	case "rate_limit_error", "insufficient_quota", "requests", "tokens", "RESOURCE_EXHAUSTED":
		return http.StatusTooManyRequests
	case "invalid_request_error", "INVALID_ARGUMENT", "FAILED_PRECONDITION":
		return http.StatusBadRequest
	case "UNAVAILABLE":
		return http.StatusServiceUnavailable
	case "authentication_error":
		return http.StatusUnauthorized
	case "permission_error":
		return http.StatusForbidden
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}

// writeError writes an HTTP error response in ep's shape. st, when not
// nil, adds its headers; id, when not empty, is the request id.
func writeError(w http.ResponseWriter, ep *endpoint, st *Step, status int, errType, code, param, message, id string) {
	if errType == "" {
		errType, _, _, _ = ep.errorFor(status, Step{}, "")
	}
	body := ep.errorBody(status, errType, code, param, message)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if id != "" {
		h.Set(ep.requestID, id)
	}
	setStepHeaders(h, st)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// header sets the response headers: content type, request id, then the
// step's own, which replace the server's for the same key.
func (x *exchange) header(st *Step, contentType string) {
	h := x.w.Header()
	h.Set("Content-Type", contentType)
	h.Set(x.requestID, x.id)
	setStepHeaders(h, st)
}

func setStepHeaders(h http.Header, st *Step) {
	if st == nil {
		return
	}
	seen := make(map[string]bool, len(st.headers))
	for _, kv := range st.headers {
		key := http.CanonicalHeaderKey(kv[0])
		if !seen[key] {
			h.Del(key)
			seen[key] = true
		}
		h.Add(key, kv[1])
	}
}

// startStream sends a stream's status line and headers.
func (x *exchange) startStream(st *Step) {
	x.w.Header().Set("Cache-Control", "no-cache")
	x.header(st, "text/event-stream; charset=utf-8")
	x.w.WriteHeader(http.StatusOK)
	x.flush()
}

// event writes one SSE event (name may be empty) and flushes it, so the
// client sees it now rather than when a buffer fills. It reports false
// when the write failed: the client is gone.
func (x *exchange) event(name string, data []byte) bool {
	buf := make([]byte, 0, len(name)+len(data)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := x.w.Write(buf); err != nil {
		return false
	}
	return x.flush()
}

func (x *exchange) flush() bool {
	return http.NewResponseController(x.w).Flush() == nil
}

// wait waits d; a zero or negative d returns at once. It reports false
// when the wait was ended by the client going away or the server closing.
func (x *exchange) wait(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-x.ctx.Done():
	case <-x.s.done:
	}
	return false
}

// stall waits until the client goes away or the server closes.
func (x *exchange) stall() {
	select {
	case <-x.ctx.Done():
	case <-x.s.done:
	}
}

// pause is the wait between two text chunks of a stream.
func (x *exchange) pause(st Step, i int) bool {
	if i == 0 {
		return true // no wait before the first chunk
	}
	return x.wait(st.every)
}

// mustJSON encodes v, whose types are this package's own and always
// encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("llmretrytest: " + err.Error())
	}
	return b
}

// inputTokens is the usage every answer reports for its prompt: the server
// does not tokenize, and tests want a number they can predict.
const inputTokens = 10
