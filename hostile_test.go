package llmretry_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// These tests run a chain against broken and hostile servers over real
// loopback HTTP, with a Call written as a careful user writes one: every
// read bounded, a status failure for a non-2xx, a parse failure for a body
// over the bound, and a stream read line by line with Delivered per chunk
// of text. Each checks the Kind, that Do returns within its limit, and
// that nothing is left behind: no connection open on either side, no
// goroutine of the client's or the server's. They are not parallel,
// because the goroutine check looks at the whole process.

// hostileLimit is the most of a response body the Call reads, and the
// longest stream line it accepts: far above any real answer, far below
// what a broken server can send.
const hostileLimit = 1 << 20

// hostileSlack is how much later than its limit Do may return. Timers do
// not fire early, so limits are lower bounds; the upper bound is generous,
// for a loaded two-core machine under the race detector.
const hostileSlack = 2 * time.Second

// hostileReq is what the Call sends: the model, whether to stream, and a
// prompt of padding bytes (a large request body) when pad > 0.
type hostileReq struct {
	model  string
	stream bool
	pad    int64
}

// hostileRig is one test's server, client and leak checks.
type hostileRig struct {
	url    string
	srv    *llmretrytest.Server // nil for a Blackhole
	hole   *llmretrytest.Blackhole
	tr     *http.Transport
	client *http.Client
	open   atomic.Int64 // client connections not yet closed
	before map[string]bool

	sent    atomic.Int64 // padding bytes the client has sent
	partial []byte       // what the Call had read of the body when a read failed
}

// newHostileRig starts a server (or, with hole, a Blackhole) and a
// client whose connections it counts.
func newHostileRig(t *testing.T, hole bool) *hostileRig {
	t.Helper()
	r := &hostileRig{before: goroutineIDs()}
	if hole {
		r.hole = llmretrytest.NewBlackhole()
		r.url = r.hole.URL
	} else {
		r.srv = llmretrytest.NewServer()
		r.url = r.srv.URL
	}
	r.tr = &http.Transport{DialContext: r.dial}
	r.client = &http.Client{Transport: r.tr}
	t.Cleanup(r.close) // in case the test stops before check
	return r
}

// dial counts the client's connections until they are closed.
func (r *hostileRig) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	r.open.Add(1)
	return &countedConn{Conn: c, open: &r.open}, nil
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

func (r *hostileRig) close() {
	if r.srv != nil {
		r.srv.Close()
	}
	if r.hole != nil {
		r.hole.Close()
	}
	r.tr.CloseIdleConnections()
}

// call is the careful user's Call.
func (r *hostileRig) call(ctx context.Context, q hostileReq) (string, error) {
	head := `{"model":` + strconv.Quote(q.model) + `,"stream":` + strconv.FormatBool(q.stream) + `,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	body := io.MultiReader(strings.NewReader(head), &padReader{left: q.pad, sent: &r.sent}, strings.NewReader(tail))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions", body)
	if err != nil {
		return "", err
	}
	req.ContentLength = int64(len(head)) + q.pad + int64(len(tail))
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	// Closing a body not read to its end closes the connection: that is
	// what ends a server that would send forever.
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, hostileLimit))
		f := llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.Join(errors.New("openai: error response"), err))
		raw := string(b)
		f.RawText = &raw
		return "", f
	}
	if !q.stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, hostileLimit+1))
		if err != nil {
			r.partial = b
			return "", fmt.Errorf("openai: reading the answer: %w", err)
		}
		if len(b) > hostileLimit {
			return "", llmretry.ParseFailure(string(b[:hostileLimit]), errors.New("openai: answer longer than 1 MiB"))
		}
		var answer struct {
			Choices []struct {
				Message struct{ Content string }
			}
		}
		if err := json.Unmarshal(b, &answer); err != nil || len(answer.Choices) == 0 {
			return "", llmretry.ParseFailure(string(b), fmt.Errorf("openai: decoding the answer: %v", err))
		}
		return answer.Choices[0].Message.Content, nil
	}
	br := bufio.NewReader(resp.Body)
	var text strings.Builder
	for {
		line, err := readLineMax(br, hostileLimit)
		switch {
		case errors.Is(err, errLineTooLong):
			return "", llmretry.ParseFailure(string(line), err)
		case err == io.EOF:
			return "", fmt.Errorf("openai: stream ended before [DONE]: %w", io.ErrUnexpectedEOF)
		case err != nil:
			r.partial = line
			return "", fmt.Errorf("openai: reading the stream: %w", err)
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue // blank lines between events, event names, comments
		}
		if string(data) == "[DONE]" {
			return text.String(), nil
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string }
			}
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return "", llmretry.ParseFailure(string(data), fmt.Errorf("openai: decoding a chunk: %v", err))
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" {
				text.WriteString(c.Delta.Content)
				llmretry.Delivered(ctx) // handed over: never resent, and the stall timer restarts
			}
		}
	}
}

var errLineTooLong = errors.New("openai: stream line longer than 1 MiB")

// readLineMax reads one line, without its newline, of at most max bytes;
// a longer one gives its first max bytes and errLineTooLong.
func readLineMax(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return append(line, frag[:max-len(line)]...), errLineTooLong
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case err != bufio.ErrBufferFull:
			return line, err
		}
	}
}

// padReader is left bytes of padding, made as they are read; sent counts
// them.
type padReader struct {
	left int64
	sent *atomic.Int64
}

func (p *padReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(b)), p.left))
	for i := range n {
		b[i] = 'a'
	}
	p.left -= int64(n)
	p.sent.Add(int64(n))
	return n, nil
}

// chain is a one-backend chain over the rig's Call.
func (r *hostileRig) chain(b llmretry.Backend[hostileReq, string]) *llmretry.Chain[hostileReq, string] {
	b.Model = "m"
	b.Call = r.call
	return &llmretry.Chain[hostileReq, string]{Backends: []llmretry.Backend[hostileReq, string]{b}}
}

// check ends the test's server and client and fails the test if anything
// is left: a connection the server still holds after Do returned (the
// client never let go of it), a client connection still open, or a
// goroutine that was not there before.
func (r *hostileRig) check(t *testing.T) {
	t.Helper()
	if r.srv != nil {
		// Before Close, which would close them anyway.
		if n := settle(func() int { return r.srv.Conns() }); n != 0 {
			t.Errorf("server holds %d connections after Do returned, want 0", n)
		}
	}
	r.close()
	if n := settle(func() int { return int(r.open.Load()) }); n != 0 {
		t.Errorf("client holds %d connections after Close, want 0", n)
	}
	var left []string
	settle(func() int {
		left = newHTTPGoroutines(r.before)
		return len(left)
	})
	if len(left) > 0 {
		t.Errorf("%d goroutines left behind:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// settle calls f until it returns 0, for a bound far above the time a
// closing connection or a returning goroutine needs, and returns what it
// returned last.
func settle(f func() int) int {
	deadline := time.Now().Add(5 * time.Second)
	n := f()
	for n != 0 && time.Now().Before(deadline) {
		runtime.Gosched()
		n = f()
	}
	return n
}

// stacks returns the stack of every goroutine.
func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID is the number in a stack's first line, "goroutine 7 [...]".
func goroutineID(stack string) string {
	f := strings.Fields(stack)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

func goroutineIDs() map[string]bool {
	ids := make(map[string]bool)
	for _, s := range stacks() {
		ids[goroutineID(s)] = true
	}
	return ids
}

// newHTTPGoroutines returns the stacks of goroutines not in before that
// belong to net/http or to llmretrytest: connections, handlers, the
// transport's readers and writers, a Blackhole's accept loop.
func newHTTPGoroutines(before map[string]bool) []string {
	var left []string
	for _, s := range stacks() {
		if !before[goroutineID(s)] && (strings.Contains(s, "net/http.") || strings.Contains(s, "llmretrytest.")) {
			left = append(left, s)
		}
	}
	return left
}

// timed runs Do and returns how long it took, and its error. A chain that
// fails to end an attempt would hang the test, so the caller withdraws
// after a backstop far past every bound; it cancels rather than setting a
// deadline, which would change the chain's decisions.
func timed(c *llmretry.Chain[hostileReq, string], q hostileReq) (string, time.Duration, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	backstop := time.AfterFunc(10*time.Second, cancel)
	defer backstop.Stop()
	start := time.Now()
	got, err := c.Do(ctx, q)
	return got, time.Since(start), err
}

// records returns the attempts of Do's error, failing the test when it
// has none.
func records(t *testing.T, err error) []llmretry.Attempt {
	t.Helper()
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) || len(ex.Attempts) == 0 {
		t.Fatalf("Do() = %v, want an Exhausted with attempts", err)
	}
	return ex.Attempts
}

// Retry-after values a broken or hostile server may send: none of them
// parks the caller or turns negative. Unreadable hints are ignored, so
// the policy's waits apply; a date in the past means now; a hint too long
// for a Duration saturates, which is longer than any MaxWait, so the
// backend stops at once for max_wait.
func TestHostileRetryAfter(t *testing.T) {
	const wait = time.Millisecond
	ignored := []llmretry.Attempt{
		{Model: "m", Try: 1, Kind: llmretry.KindTransient, Status: 429, Next: llmretry.NextRetry, RetryIn: wait},
		{Model: "m", Try: 2, Kind: llmretry.KindTransient, Status: 429, Next: llmretry.NextRetry, RetryIn: wait},
		{Model: "m", Try: 3, Kind: llmretry.KindTransient, Status: 429, Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
	}
	tooLong := []llmretry.Attempt{
		{Model: "m", Try: 1, Kind: llmretry.KindTransient, Status: 429, RetryAfter: math.MaxInt64, Next: llmretry.NextStop, Why: llmretry.WhyMaxWait},
	}
	tests := []struct {
		name    string
		key     string
		value   string
		maxWait time.Duration // Policy.MaxWait
		want    []llmretry.Attempt
	}{
		{"exponent", "retry-after", "1e18", 0, ignored},
		{"negative", "retry-after", "-1", 0, ignored},
		{"nan", "retry-after", "NaN", 0, ignored},
		{"infinity", "retry-after", "+Inf", 0, ignored},
		{"date_1970", "retry-after", "Thu, 01 Jan 1970 00:00:00 GMT", 0, ignored},
		{"ms_negative", "retry-after-ms", "-1", 0, ignored},
		{"date_9999", "retry-after", "Fri, 31 Dec 9999 23:59:59 GMT", 0, tooLong},
		{"seconds_1e18", "retry-after", "1000000000000000000", 0, tooLong},
		{"ms_overflow", "retry-after-ms", "99999999999999999999999", 0, tooLong},
		// Saturated, the hint is longer than even the longest MaxWait.
		{"date_9999_longest_max_wait", "retry-after", "Fri, 31 Dec 9999 23:59:59 GMT", math.MaxInt64 - 1, tooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newHostileRig(t, false)
			r.srv.Script("m", llmretrytest.Status(429).WithHeader(tc.key, tc.value))
			c := r.chain(llmretry.Backend[hostileReq, string]{
				Retry: llmretry.Policy{Waits: []time.Duration{wait, wait}, MaxWait: tc.maxWait},
			})
			_, took, err := timed(c, hostileReq{model: "m"})
			got := records(t, err)
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(llmretry.Attempt{}, "Err", "RawText", "Start", "Elapsed")); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			for _, a := range got {
				if a.RetryAfter < 0 {
					t.Errorf("try %d: RetryAfter = %v, want never negative", a.Try, a.RetryAfter)
				}
				if a.RawText == nil || !strings.HasPrefix(*a.RawText, `{"error":`) {
					t.Errorf("try %d: RawText = %v, want the error body", a.Try, a.RawText)
				}
			}
			if n := len(r.srv.Requests()); n != len(tc.want) {
				t.Errorf("the server saw %d requests, want %d", n, len(tc.want))
			}
			if took > hostileSlack {
				t.Errorf("Do took %v, want well under %v", took, hostileSlack)
			}
			t.Logf("Do took %v", took)
			r.check(t)
		})
	}
}

// heapNow is the memory held by heap objects, live or not yet swept.
func heapNow() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

// heapWatch samples the heap every millisecond until stopped, and returns
// the peak.
func heapWatch() (stop func() uint64) {
	read := heapNow
	quit, peak := make(chan struct{}), make(chan uint64)
	go func() {
		p := read()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				peak <- max(p, read())
				return
			case <-tick.C:
				p = max(p, read())
			}
		}
	}()
	return func() uint64 {
		close(quit)
		return <-peak
	}
}

// hostileHeapBound is how far the heap may grow while Do runs against a
// hostile server. What may legitimately be live: the Call's 1 MiB read
// and its 1 MiB string, the record's 64 KiB, one 32 KiB block on the
// server, the transport's buffers; and garbage up to the collector's goal,
// about twice that. 64 MiB is far above all of it and sixteen times below
// a 1 GiB body: whoever held such a body would cross it many times over.
const hostileHeapBound = 64 << 20

// timedHeap runs c on q as timed does, and fails the test if the heap
// grew by more than hostileHeapBound while it ran.
func timedHeap(t *testing.T, c *llmretry.Chain[hostileReq, string], q hostileReq) (time.Duration, error) {
	t.Helper()
	runtime.GC()
	base := heapNow()
	stop := heapWatch()
	_, took, err := timed(c, q)
	peak := stop()
	grew := int64(peak) - int64(base)
	t.Logf("Do took %v; heap: baseline %d KiB, peak %d KiB, grew %d KiB", took, base>>10, peak>>10, grew>>10)
	if grew > hostileHeapBound {
		t.Errorf("the heap grew by %d MiB while Do ran, want under %d MiB", grew>>20, hostileHeapBound>>20)
	}
	return took, err
}

// A 1 GiB answer, as JSON or as one stream line: the Call stops at its
// bound with a parse failure, the record keeps 64 KiB of it with the cut
// marked, and the heap never holds the gigabyte, on the server's side or
// the client's.
func TestHostileHugeBody(t *testing.T) {
	const size = 1 << 30
	for _, stream := range []bool{false, true} {
		t.Run("stream_"+strconv.FormatBool(stream), func(t *testing.T) {
			r := newHostileRig(t, false)
			r.srv.Script("m", llmretrytest.HugeBody(size))
			c := r.chain(llmretry.Backend[hostileReq, string]{Timeout: 10 * time.Second})

			took, err := timedHeap(t, c, hostileReq{model: "m", stream: stream})

			got := records(t, err)
			if len(got) != 1 || got[0].Kind != llmretry.KindParse {
				t.Fatalf("attempts = %v, want one parse failure", got)
			}
			raw := got[0].RawText
			const mark = " [llmretry: 983040 bytes cut]" // the Call keeps 1 MiB; the record 64 KiB of it
			if raw == nil {
				t.Fatal("RawText = nil, want what the Call read, capped")
			}
			if len(*raw) != llmretry.DefaultMaxRawText+len(mark) || !strings.HasSuffix(*raw, mark) {
				t.Fatalf("RawText has %d bytes ending %q, want %d ending %q",
					len(*raw), (*raw)[max(0, len(*raw)-len(mark)):], llmretry.DefaultMaxRawText+len(mark), mark)
			}
			kept := strings.TrimSuffix(*raw, mark)
			start := `{"id":"chatcmpl-`
			if stream {
				start = "data: " + start
			}
			// Everything after the answer's opening is its text, all x.
			i := strings.LastIndex(kept, `"content":"`) + len(`"content":"`)
			if !strings.HasPrefix(kept, start) || strings.Count(kept[i:], "x") != len(kept)-i || len(kept)-i < 60<<10 {
				t.Errorf("RawText starts %.120q and has %d bytes of x after the opening; want an answer, then x", kept, strings.Count(kept[i:], "x"))
			}
			if took > hostileSlack {
				t.Errorf("Do took %v, want well under %v", took, hostileSlack)
			}
			r.check(t)
		})
	}
}

// Servers that never finish: a body that never ends, a trickle of bytes
// that never completes a chunk, headers that never come or stop halfway.
// The Call's bound ends a fast endless body; the backend's Timeout or
// StallTimeout ends the rest, as KindTimeout, in time.
func TestHostileNeverFinishes(t *testing.T) {
	const limit = 200 * time.Millisecond
	tests := []struct {
		name    string
		step    llmretrytest.Step
		stream  bool
		timeout time.Duration // Backend.Timeout
		stall   time.Duration // Backend.StallTimeout
		want    llmretry.Kind
		// trickled says the Call must have read some of the answer's text
		// when the limit ended it: proof that bytes kept coming.
		trickled bool
	}{
		// As fast as loopback goes: the Call's 1 MiB bound is reached
		// long before any timer.
		{name: "endless_fast", step: llmretrytest.EndlessBody(), timeout: 10 * time.Second, want: llmretry.KindParse},
		{name: "endless_fast_stream", step: llmretrytest.EndlessBody(), stream: true, timeout: 10 * time.Second, want: llmretry.KindParse},
		// 32 KiB every 50ms: 1 MiB would take 1.5s, so the Timeout comes
		// first.
		{name: "endless_slow", step: llmretrytest.EndlessBody().Every(50 * time.Millisecond), timeout: limit, want: llmretry.KindTimeout, trickled: true},
		{name: "trickle", step: llmretrytest.Trickle(20 * time.Millisecond), timeout: limit, want: llmretry.KindTimeout, trickled: true},
		// A byte every 20ms keeps the connection busy, but no chunk of
		// text ever reaches the caller, so nothing restarts the stall
		// timer: StallTimeout ends it, with no Timeout at all.
		{name: "trickle_stream", step: llmretrytest.Trickle(20 * time.Millisecond), stream: true, stall: limit, want: llmretry.KindTimeout, trickled: true},
		{name: "stall_headers", step: llmretrytest.StallHeaders(), timeout: limit, want: llmretry.KindTimeout},
		{name: "stall_headers_stream", step: llmretrytest.StallHeaders(), stream: true, stall: limit, want: llmretry.KindTimeout},
		{name: "partial_headers", step: llmretrytest.PartialHeaders(), timeout: limit, want: llmretry.KindTimeout},
		{name: "partial_headers_stream", step: llmretrytest.PartialHeaders(), stream: true, stall: limit, want: llmretry.KindTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newHostileRig(t, false)
			r.srv.Script("m", tc.step)
			c := r.chain(llmretry.Backend[hostileReq, string]{Timeout: tc.timeout, StallTimeout: tc.stall})
			took, err := timedHeap(t, c, hostileReq{model: "m", stream: tc.stream})
			got := records(t, err)
			if len(got) != 1 || got[0].Kind != tc.want || got[0].Delivered {
				t.Fatalf("attempts = %v, want one %v that delivered nothing", got, tc.want)
			}
			if tc.want == llmretry.KindTimeout {
				var to *llmretry.TimedOut
				if !errors.As(err, &to) || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Do() = %T %v, want a TimedOut", err, err)
				}
				if took < limit {
					t.Errorf("Do took %v, before its limit %v", took, limit)
				}
			}
			if bound := max(tc.timeout, tc.stall); tc.want == llmretry.KindParse {
				// The Call's bound, not a timer, ended it.
				if took > hostileSlack {
					t.Errorf("Do took %v, want well under %v", took, hostileSlack)
				}
			} else if took > bound+hostileSlack {
				t.Errorf("Do took %v, want about %v", took, bound)
			}
			if tc.trickled {
				// What follows the text's opening quote is the text so far.
				const open = `"content":"`
				i := bytes.LastIndex(r.partial, []byte(open))
				text := r.partial[i+len(open):]
				if i < 0 || len(text) == 0 || bytes.Count(text, []byte("x")) != len(text) {
					t.Errorf("the Call had read %.200q when the limit ended it, want an answer's opening and some x", r.partial)
				} else {
					t.Logf("%d bytes of text had come", len(text))
				}
			}
			r.check(t)
		})
	}
}

// A host that accepts the connection and never reads: a request body
// larger than the connection's buffers blocks in its write, and the
// backend's Timeout ends it.
func TestHostileBlackhole(t *testing.T) {
	const limit = 200 * time.Millisecond
	const pad = 256 << 20
	r := newHostileRig(t, true)
	c := r.chain(llmretry.Backend[hostileReq, string]{Timeout: limit})
	took, err := timedHeap(t, c, hostileReq{model: "m", pad: pad})
	t.Logf("the client sent %d KiB of its %d MiB body", r.sent.Load()>>10, pad>>20)
	got := records(t, err)
	if len(got) != 1 || got[0].Kind != llmretry.KindTimeout {
		t.Fatalf("attempts = %v, want one timeout", got)
	}
	if took < limit || took > limit+hostileSlack {
		t.Errorf("Do took %v, want about %v", took, limit)
	}
	if n := r.sent.Load(); n >= pad {
		t.Errorf("the client sent its whole body (%d bytes); want it blocked in the write", n)
	}
	// The kernel completes a connection before the Blackhole's accept
	// loop takes it: give a loaded machine time to run that loop.
	if n := 1 - settle(func() int { return 1 - r.hole.Accepted() }); n != 1 {
		t.Errorf("Accepted() = %d, want 1", n)
	}
	r.check(t)
}
