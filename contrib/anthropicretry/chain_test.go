package anthropicretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// These tests put a real anthropic.Client behind a Chain and talk to a
// scripted provider over loopback, so what they check is what the SDK
// and the chain do together on the wire.

// fakeKey is shaped like a real key, so that a test would see it if it
// leaked into a message.
const fakeKey = "sk-ant-test-0123456789abcdef"

// tiny is the wait between tries: short enough for quick tests, and never
// asserted on.
var tiny = llmretry.Policy{Waits: []time.Duration{time.Millisecond, time.Millisecond}}

func newServer(t *testing.T) *llmretrytest.Server {
	t.Helper()
	srv := llmretrytest.NewServer()
	t.Cleanup(srv.Close)
	return srv
}

// newClient is a client as a user builds one: the SDK's default retries
// are left on, to show that the Backends turn them off.
func newClient(srv *llmretrytest.Server) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(srv.AnthropicBaseURL()), option.WithAPIKey(fakeKey))
}

// build makes the request; its model is replaced by the Backend's, which
// the server's log shows.
func build(prompt string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "model-from-params",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))},
	}
}

// mode is how a test's Backends call the API: Messages, MessagesStream
// with an emit, or MessagesStream with a nil emit, which holds the answer
// until it is whole.
type mode struct {
	name     string
	stream   bool
	buffered bool // a stream with a nil emit
}

var (
	jsonMode     = mode{name: "json"}
	streamMode   = mode{name: "stream", stream: true}
	bufferedMode = mode{name: "buffered", stream: true, buffered: true}
	modes        = []mode{jsonMode, streamMode, bufferedMode}
)

// delivers reports whether the mode hands text to the caller as it comes.
func (m mode) delivers() bool { return m.stream && !m.buffered }

// backend returns a Backend for model in mode m, with the text streamed to
// it appended to *emitted.
func (m mode) backend(client anthropic.Client, model string, policy llmretry.Policy, emitted *[]string) llmretry.Backend[string, llmretry.Completion] {
	var b llmretry.Backend[string, llmretry.Completion]
	switch {
	case m.buffered:
		b = anthropicretry.MessagesStream(client, model, build, nil)
	case m.stream:
		b = anthropicretry.MessagesStream(client, model, build, func(_ string, delta string) {
			if emitted != nil {
				*emitted = append(*emitted, delta)
			}
		})
	default:
		b = anthropicretry.Messages(client, model, build)
	}
	b.Retry = policy
	return b
}

// run sends one prompt through a chain of backends and returns the answer,
// every attempt's record (the successful one included) and the error.
func run(ctx context.Context, backends ...llmretry.Backend[string, llmretry.Completion]) (llmretry.Completion, []llmretry.Attempt, error) {
	return runChain(ctx, &llmretry.Chain[string, llmretry.Completion]{}, backends...)
}

// runChain is run with the settings of chain, whose Backends and OnAttempt
// it sets.
func runChain(ctx context.Context, chain *llmretry.Chain[string, llmretry.Completion], backends ...llmretry.Backend[string, llmretry.Completion]) (llmretry.Completion, []llmretry.Attempt, error) {
	var records []llmretry.Attempt
	chain.Backends = backends
	chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { records = append(records, a) }
	answer, err := chain.Do(ctx, "Say hello.")
	return answer, records, err
}

// sent is what a record and a log entry both say about one request.
type sent struct {
	Model  string
	Status int
}

// matchLog checks that the chain's records and the servers' logs tell the
// same story, request for request: the same number of requests, in the
// same order, to the same models, with the statuses the scripted steps
// stand for, each received while its attempt was under way. Attempts
// that never reached a server (a refused connection, a configuration
// error) are left out.
// When err is a chain error, its records must be the failed ones.
func matchLog(t *testing.T, records []llmretry.Attempt, err error, servers ...*llmretrytest.Server) {
	t.Helper()
	var log []llmretrytest.Request
	for _, srv := range servers {
		log = append(log, srv.Requests()...)
	}
	slices.SortStableFunc(log, func(a, b llmretrytest.Request) int { return a.Time.Compare(b.Time) })

	var reached []llmretry.Attempt
	for _, a := range records {
		// A refused connection and a request refused before sending
		// never reached the server.
		if !errors.Is(a.Err, syscall.ECONNREFUSED) && !errors.Is(a.Err, llmretry.ErrConfig) {
			reached = append(reached, a)
		}
	}
	var got, want []sent
	for _, a := range reached {
		got = append(got, sent{a.Model, a.Status})
	}
	for _, r := range log {
		want = append(want, sent{r.Model, statusOf(t, r)})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records and server log differ (-log +records):\n%s", diff)
	}
	// Each request arrived while its attempt ran: the log and the records
	// are the same requests, not merely as many. A few milliseconds of
	// slack keep wall-clock steps from failing the test.
	const slack = 5 * time.Millisecond
	for i := range min(len(reached), len(log)) {
		a, r := reached[i], log[i]
		if r.Time.Before(a.Start.Add(-slack)) || r.Time.After(a.Start.Add(a.Elapsed+slack)) {
			t.Errorf("request %d arrived at %v, outside its attempt [%v, +%v]", i, r.Time, a.Start, a.Elapsed)
		}
	}

	var exhausted *llmretry.Exhausted
	if errors.As(err, &exhausted) {
		var failed []llmretry.Attempt
		for _, a := range records {
			if a.Err != nil {
				failed = append(failed, a)
			}
		}
		if diff := cmp.Diff(failed, exhausted.Attempts, cmp.Comparer(sameError)); diff != "" {
			t.Errorf("error's attempts and OnAttempt's records differ (-OnAttempt +error):\n%s", diff)
		}
	}
}

func sameError(a, b error) bool { return a == b }

// statusOf is the status a logged request's step stands for in a record:
// the HTTP status, or for an error event in a stream the status its type
// stands for; 0 for an answer or a broken connection.
func statusOf(t *testing.T, r llmretrytest.Request) int {
	t.Helper()
	if rest, ok := strings.CutPrefix(r.Step, "status "); ok {
		code, _, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil {
			t.Fatalf("log step %q: %v", r.Step, err)
		}
		return n
	}
	if typ, ok := strings.CutPrefix(r.Step, "stream error "); ok {
		streamStatus := map[string]int{"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429}
		jsonStatus := map[string]int{"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429, "invalid_request_error": 400}
		if r.Stream {
			return streamStatus[typ]
		}
		return jsonStatus[typ]
	}
	return 0
}

// kinds lists the records' kinds, for a compact comparison.
func kinds(records []llmretry.Attempt) []string {
	var ks []string
	for _, a := range records {
		k := "ok"
		if a.Err != nil {
			k = a.Kind.String()
		}
		ks = append(ks, a.Model+" "+k)
	}
	return ks
}

func checkKinds(t *testing.T, records []llmretry.Attempt, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, kinds(records)); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}

func TestRetriesThenAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Status(503), llmretrytest.Status(503), llmretrytest.Answer("Hello there, friend."))
			var emitted []string
			answer, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", tiny, &emitted))
			if err != nil {
				t.Fatalf("Do() = %v, want an answer", err)
			}
			msg, ok := answer.Raw.(*anthropic.Message)
			if !ok {
				t.Fatalf("Completion.Raw = %T, want *anthropic.Message", answer.Raw)
			}
			if msg.ID != "msg_claude-a_3" {
				t.Errorf("Completion.Raw.ID = %q, want the third request's message", msg.ID)
			}
			answer.Raw = nil // the SDK's types do not compare; checked above
			want := llmretry.Completion{
				ID: "msg_claude-a_3", Model: "claude-a", Text: "Hello there, friend.", StopReason: "end_turn",
				InputTokens: 10, OutputTokens: 3,
			}
			if diff := cmp.Diff(want, answer); diff != "" {
				t.Errorf("Do() answer (-want +got):\n%s", diff)
			}
			if m.delivers() {
				if diff := cmp.Diff([]string{"Hello ", "there, ", "friend."}, emitted); diff != "" {
					t.Errorf("emitted (-want +got):\n%s", diff)
				}
			}
			checkKinds(t, records, "claude-a transient", "claude-a transient", "claude-a ok")
			if got := len(srv.Requests()); got != 3 {
				t.Errorf("server got %d requests, want 3", got)
			}
			if got, want := records[2].Delivered, m.delivers(); got != want {
				t.Errorf("answer's Delivered = %v, want %v", got, want)
			}
			if msg := records[0].Err.Error(); !strings.Contains(msg, "api_error") || !strings.Contains(msg, "req_claude-a_1") {
				t.Errorf("record error %q, want the error type and request id", msg)
			}
			for _, a := range records {
				if a.Err != nil && strings.Contains(a.Err.Error(), fakeKey) {
					t.Errorf("record error %q holds the API key", a.Err)
				}
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestOneRequestPerAttempt(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Status(503)) // forever
			// The client keeps the SDK's default of two retries per
			// request; unless the Backend turns them off, three attempts
			// cost nine requests.
			_, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", tiny, nil))
			if err == nil {
				t.Fatal("Do() = nil error, want the 503s")
			}
			if got := len(srv.Requests()); got != 3 {
				t.Errorf("server got %d requests for 3 attempts, want 3", got)
			}
			checkKinds(t, records, "claude-a transient", "claude-a transient", "claude-a transient")
			matchLog(t, records, err, srv)
		})
	}
}

func TestRetryAfterMsHonoured(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Status(429).WithHeader("retry-after-ms", "300"), llmretrytest.Answer("ok"))
			_, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want an answer", err)
			}
			log := srv.Requests()
			if len(log) != 2 {
				t.Fatalf("server got %d requests, want 2", len(log))
			}
			if gap := log[1].Time.Sub(log[0].Time); gap < 300*time.Millisecond {
				t.Errorf("retry sent %v after the 429, want >= 300ms (retry-after-ms)", gap)
			}
			if got := records[0].RetryIn; got != 300*time.Millisecond {
				t.Errorf("record RetryIn = %v, want 300ms", got)
			}
			checkKinds(t, records, "claude-a transient", "claude-a ok")
			matchLog(t, records, err, srv)
		})
	}
}

func TestRetryAfterBeyondMaxWaitFailsOver(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Status(429).WithHeader("retry-after", "60"))
			srv.Script("claude-b", llmretrytest.Answer("from b"))
			client := newClient(srv)
			policy := llmretry.Policy{Waits: []time.Duration{time.Millisecond}, MaxWait: time.Second}
			answer, records, err := run(t.Context(),
				m.backend(client, "claude-a", policy, nil),
				m.backend(client, "claude-b", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want b's answer", err)
			}
			if answer.Text != "from b" {
				t.Errorf("answer = %q, want %q", answer.Text, "from b")
			}
			checkKinds(t, records, "claude-a transient", "claude-b ok")
			if got := records[0]; got.Why != llmretry.WhyMaxWait || got.RetryAfter != time.Minute {
				t.Errorf("a's record says why %q, retry-after %v; want %q, 1m0s", got.Why, got.RetryAfter, llmretry.WhyMaxWait)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestOverloadedRetried(t *testing.T) {
	t.Parallel()
	steps := []llmretrytest.Step{llmretrytest.Status(529), llmretrytest.StreamError("overloaded_error"), llmretrytest.StreamError("api_error")}
	for _, m := range modes {
		for _, step := range steps {
			t.Run(m.name+"/"+strings.ReplaceAll(step.String(), " ", "_"), func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("claude-a", step, llmretrytest.Answer("ok"))
				_, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", tiny, nil))
				if err != nil {
					t.Fatalf("Do() = %v, want an answer after one retry", err)
				}
				checkKinds(t, records, "claude-a transient", "claude-a ok")
				matchLog(t, records, err, srv)
			})
		}
	}
}

func TestContextLengthFailsOverAtOnce(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.ContextLengthExceeded())
			srv.Script("claude-b", llmretrytest.ContextLengthExceeded())
			client := newClient(srv)
			_, records, err := run(t.Context(),
				m.backend(client, "claude-a", tiny, nil),
				m.backend(client, "claude-b", tiny, nil))
			if !errors.As(err, new(*llmretry.Exhausted)) {
				t.Fatalf("Do() = %v, want an *llmretry.Exhausted", err)
			}
			checkKinds(t, records, "claude-a rejected", "claude-b rejected")
			if msg := records[0].Err.Error(); !strings.Contains(msg, "prompt is too long") {
				t.Errorf("record error %q, want the provider's message", msg)
			}
			if llmretry.RetryItem(err) {
				t.Errorf("RetryItem(%v) = true, want false: every backend rejected the prompt as too long", err)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestTruncationKeepsPartialText(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Truncated("The answer is"))
			srv.Script("claude-b", llmretrytest.Answer("from b"))
			client := newClient(srv)
			answer, records, err := run(t.Context(),
				m.backend(client, "claude-a", tiny, nil),
				m.backend(client, "claude-b", tiny, nil))
			if m.delivers() {
				// The caller already holds the streamed words, so the
				// truncation is the chain's answer: nothing else is tried.
				if !errors.As(err, new(*llmretry.Truncated)) {
					t.Fatalf("Do() = %v, want an *llmretry.Truncated", err)
				}
				checkKinds(t, records, "claude-a truncated")
				if !records[0].Delivered {
					t.Error("truncated stream's Delivered = false, want true")
				}
			} else {
				if err != nil || answer.Text != "from b" {
					t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
				}
				checkKinds(t, records, "claude-a truncated", "claude-b ok")
			}
			if raw := records[0].RawText; raw == nil || *raw != "The answer is" {
				t.Errorf("truncated record's RawText = %v, want %q", raw, "The answer is")
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestStreamCutAfterTextIsNotResent(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("claude-a", llmretrytest.StreamDrop(2))
	srv.Script("claude-b", llmretrytest.Answer("from b"))
	client := newClient(srv)
	var emitted []string
	_, records, err := run(t.Context(),
		streamMode.backend(client, "claude-a", tiny, &emitted),
		streamMode.backend(client, "claude-b", tiny, nil))
	if err == nil {
		t.Fatal("Do() = nil error, want the cut stream's")
	}
	checkKinds(t, records, "claude-a transient")
	if !records[0].Delivered {
		t.Error("cut stream's Delivered = false, want true")
	}
	if raw := records[0].RawText; raw == nil || *raw != "chunk1 chunk2 " {
		t.Errorf("cut stream's RawText = %v, want %q", raw, "chunk1 chunk2 ")
	}
	if diff := cmp.Diff([]string{"chunk1 ", "chunk2 "}, emitted); diff != "" {
		t.Errorf("emitted (-want +got):\n%s", diff)
	}
	matchLog(t, records, err, srv)
}

func TestStreamCutBeforeTextIsRetried(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("claude-a", llmretrytest.StreamDrop(0), llmretrytest.Answer("ok"))
	answer, records, err := run(t.Context(), streamMode.backend(newClient(srv), "claude-a", tiny, nil))
	if err != nil || answer.Text != "ok" {
		t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
	}
	checkKinds(t, records, "claude-a transient", "claude-a ok")
	if records[0].Delivered {
		t.Error("stream cut before text has Delivered = true, want false")
	}
	matchLog(t, records, err, srv)
}

func TestUnfinishedIsNotSuccess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mode mode
		step llmretrytest.Step
		want []string // the records' kinds
		raw  string   // the first record's raw text
	}{
		// A JSON answer with no stop_reason was cut short somewhere.
		{"json", jsonMode, llmretrytest.StreamUnfinished(2), []string{"claude-a transient", "claude-a ok"}, ""},
		{"stream_before_text", streamMode, llmretrytest.StreamUnfinished(0), []string{"claude-a transient", "claude-a ok"}, ""},
		{"stream_after_text", streamMode, llmretrytest.StreamUnfinished(2), []string{"claude-a transient"}, "chunk1 chunk2 "},
		// Held text is not delivered: the stream is sent again.
		{"buffered_after_text", bufferedMode, llmretrytest.StreamUnfinished(2), []string{"claude-a transient", "claude-a ok"}, "chunk1 chunk2 "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", tc.step, llmretrytest.Answer("ok"))
			_, records, err := run(t.Context(), tc.mode.backend(newClient(srv), "claude-a", tiny, nil))
			checkKinds(t, records, tc.want...)
			if first := records[0]; tc.raw != "" && (first.RawText == nil || *first.RawText != tc.raw) {
				t.Errorf("first record's RawText = %v, want %q", first.RawText, tc.raw)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestConnectionRefusedIsTransient(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			down := newServer(t)
			// The first request finds the provider going down; the
			// retries find nothing listening.
			down.Script("claude-a", llmretrytest.Down())
			up := newServer(t)
			up.Script("claude-b", llmretrytest.Answer("from b"))
			answer, records, err := run(t.Context(),
				m.backend(newClient(down), "claude-a", tiny, nil),
				m.backend(newClient(up), "claude-b", tiny, nil))
			if err != nil || answer.Text != "from b" {
				t.Fatalf("Do() = %q, %v; want b's answer", answer.Text, err)
			}
			checkKinds(t, records, "claude-a transient", "claude-a transient", "claude-a transient", "claude-b ok")
			for _, a := range records[1:3] {
				if !errors.Is(a.Err, syscall.ECONNREFUSED) {
					t.Errorf("retry of a: %v, want a refused connection", a.Err)
				}
			}
			matchLog(t, records, err, down, up)
		})
	}
}

func TestLongNonStreamingRequest(t *testing.T) {
	t.Parallel()
	// The SDK reckons an hour per 128,000 tokens and refuses, without a
	// request timeout, anything that may take longer than ten minutes.
	long := func(prompt string) anthropic.MessageNewParams {
		p := build(prompt)
		p.MaxTokens = 64000
		return p
	}
	t.Run("no_deadline", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t)
		srv.Script("claude-a", llmretrytest.Answer("ok"))
		b := anthropicretry.Messages(newClient(srv), "claude-a", long)
		b.Retry = tiny
		_, records, err := run(t.Context(), b)
		// The attempt's error wraps ErrConfig and stays in its record; the
		// chain's outcome is the Exhausted of a refused request.
		var ex *llmretry.Exhausted
		if !errors.As(err, &ex) || len(ex.Attempts) != 1 || !errors.Is(ex.Attempts[0].Err, llmretry.ErrConfig) {
			t.Fatalf("Do() = %v, want an *Exhausted whose record's Err wraps ErrConfig", err)
		}
		if errors.Is(err, llmretry.ErrConfig) {
			t.Errorf("errors.Is(Do(), ErrConfig) = true, want false: an attempt's error is not in the outcome's tree")
		}
		if !strings.Contains(err.Error(), "MessagesStream") {
			t.Errorf("Do() = %q, want it to name MessagesStream", err)
		}
		if llmretry.RetryItem(err) {
			t.Errorf("RetryItem(%v) = true, want false", err)
		}
		checkKinds(t, records, "claude-a rejected")
		matchLog(t, records, err, srv) // and no request was sent
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t)
		srv.Script("claude-a", llmretrytest.Answer("ok"))
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		answer, records, err := run(ctx, anthropicretry.Messages(newClient(srv), "claude-a", long))
		if err != nil || answer.Text != "ok" {
			t.Fatalf("Do() = %q, %v; want the answer", answer.Text, err)
		}
		matchLog(t, records, err, srv)
	})
	t.Run("backend_timeout", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t)
		srv.Script("claude-a", llmretrytest.Answer("ok"))
		b := anthropicretry.Messages(newClient(srv), "claude-a", long)
		b.Timeout = time.Minute
		answer, records, err := run(t.Context(), b)
		if err != nil || answer.Text != "ok" {
			t.Fatalf("Do() = %q, %v; want the answer", answer.Text, err)
		}
		matchLog(t, records, err, srv)
	})
}

func TestNoTextIsParseFailure(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Answer(""), llmretrytest.Answer("ok"))
			answer, records, err := run(t.Context(), m.backend(newClient(srv), "claude-a", tiny, nil))
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			checkKinds(t, records, "claude-a parse", "claude-a ok")
			matchLog(t, records, err, srv)
		})
	}
}

// The statuses a record carries for an HTTP error must be the response's,
// for any status the provider sends.
func TestStatusesReachRecords(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusInternalServerError} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", llmretrytest.Status(code))
			_, records, err := run(t.Context(), mode{}.backend(newClient(srv), "claude-a", tiny, nil))
			want := "claude-a rejected"
			n := 1
			if code >= 500 {
				want, n = "claude-a transient", 3
			}
			checkKinds(t, records, slices.Repeat([]string{want}, n)...)
			matchLog(t, records, err, srv)
		})
	}
}

// An attempt ended by Backend.Timeout says so in its record, "llmretry:
// attempt timeout", not as the SDK's bare "context deadline exceeded".
func TestTimeoutNamesItsCause(t *testing.T) {
	t.Parallel()
	steps := map[string]llmretrytest.Step{"json": llmretrytest.StallHeaders(), "stream": llmretrytest.StreamStall(0), "buffered": llmretrytest.StreamStall(0)}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", steps[m.name], llmretrytest.Answer("ok"))
			b := m.backend(newClient(srv), "claude-a", tiny, nil)
			b.Timeout = 300 * time.Millisecond
			answer, records, err := run(t.Context(), b)
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			checkKinds(t, records, "claude-a timeout", "claude-a ok")
			// The same text as openairetry's record of the same attempt.
			if got, want := records[0].Err.Error(), llmretry.ErrAttemptTimeout.Error(); got != want {
				t.Errorf("timed-out record's error = %q, want %q", got, want)
			}
			matchLog(t, records, err, srv)
		})
	}
}

func TestBrokenResponses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mode mode
		step llmretrytest.Step
		want []string // the records' kinds
	}{
		// Connections that break before any answer are worth another try.
		{"json_hangup", jsonMode, llmretrytest.Hangup(), []string{"claude-a transient", "claude-a ok"}},
		{"stream_hangup", streamMode, llmretrytest.Hangup(), []string{"claude-a transient", "claude-a ok"}},
		{"json_body_cut", jsonMode, llmretrytest.StreamDrop(2), []string{"claude-a transient", "claude-a ok"}},
		// JSON that ends early reads as a cut body (an unexpected EOF).
		{"json_malformed", jsonMode, llmretrytest.Malformed(), []string{"claude-a transient", "claude-a ok"}},
		// An event that does not decode is garbled on the way, most
		// likely for this once: nothing has reached the caller, so it is
		// tried again.
		{"stream_malformed", streamMode, llmretrytest.Malformed(), []string{"claude-a transient", "claude-a ok"}},
		{"buffered_malformed", bufferedMode, llmretrytest.Malformed(), []string{"claude-a transient", "claude-a ok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", tc.step, llmretrytest.Answer("ok"))
			srv.Script("claude-b", llmretrytest.Answer("ok"))
			client := newClient(srv)
			_, records, err := run(t.Context(), tc.mode.backend(client, "claude-a", tiny, nil), tc.mode.backend(client, "claude-b", tiny, nil))
			if err != nil {
				t.Fatalf("Do() = %v, want an answer", err)
			}
			checkKinds(t, records, tc.want...)
			matchLog(t, records, err, srv)
		})
	}
}

// An answer that only calls a tool is an answer, not a parse failure.
func TestToolUseIsAnAnswer(t *testing.T) {
	t.Parallel()
	const body = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-a",` +
		`"content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}],` +
		`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":5}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	defer srv.Close()
	client := anthropic.NewClient(option.WithBaseURL(srv.URL+"/"), option.WithAPIKey(fakeKey))
	answer, _, err := run(t.Context(), anthropicretry.Messages(client, "claude-a", build))
	if err != nil {
		t.Fatalf("Do() = %v, want the tool call", err)
	}
	if answer.StopReason != "tool_use" || answer.Text != "" || answer.OutputTokens != 5 {
		t.Errorf("Do() = %+v, want stop_reason tool_use, no text, 5 output tokens", answer)
	}
	if msg := answer.Raw.(*anthropic.Message); len(msg.Content) != 1 || msg.Content[0].Name != "get_weather" {
		t.Errorf("Raw content = %+v, want the tool call", msg.Content)
	}
}
