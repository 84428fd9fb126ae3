package openairetry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// These tests run the real openai-go client against llmretrytest's
// scripted server over loopback, in both modes, and check every chain
// record against the request the server logged for it.

// testKey looks like a key, so that a test would show it if it leaked.
const testKey = "sk-test-openairetry-0123456789"

// short is the wait between retries: long enough to be a real wait, short
// enough to keep the suite quick.
const short = time.Millisecond

// mode is how a backend talks to the server.
type mode int

const (
	plain      mode = iota // Chat
	stream                 // ChatStream
	respPlain              // Responses
	respStream             // ResponsesStream
)

var modes = []mode{plain, stream, respPlain, respStream}

func (m mode) String() string {
	return [...]string{"json", "stream", "responses_json", "responses_stream"}[m]
}

// streams reports whether m asks for a stream.
func (m mode) streams() bool { return m == stream || m == respStream }

// api is the endpoint m's requests reach, as the server logs it.
func (m mode) api() string {
	if m == respPlain || m == respStream {
		return "openai-responses"
	}
	return "openai"
}

// in is the mode of m's shape, plain or streaming, in the API of r.
func (m mode) in(r mode) mode {
	base := plain
	if r == respPlain || r == respStream {
		base = respPlain
	}
	if m.streams() {
		return base + 1
	}
	return base
}

// apis are one mode of each API, for tests that run a table in both.
var apis = []mode{plain, respPlain}

// newServer starts a scripted provider that the test closes.
func newServer(t *testing.T) *llmretrytest.Server {
	t.Helper()
	srv := llmretrytest.NewServer()
	t.Cleanup(srv.Close)
	return srv
}

// newClient builds a real client for srv. Without opts it keeps the SDK's
// default of two retries, which the backends must turn off.
func newClient(srv *llmretrytest.Server, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(srv.OpenAIBaseURL()),
		option.WithAPIKey(testKey),
	}, opts...)...)
}

// build makes the SDK's parameters for a question. Its model has no
// script on any server, so a backend that failed to put its own model in
// would get a 404.
func build(q string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "not-scripted",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)},
	}
}

// buildResponses is build for the Responses API.
func buildResponses(q string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "not-scripted",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(q)},
	}
}

// deltas collects what a streaming backend emits.
type deltas struct {
	mu   sync.Mutex
	list []string
}

func (d *deltas) emit(_ string, delta string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list = append(d.list, delta)
}

func (d *deltas) all() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.list)
}

// backend returns the backend for model in mode m, emitting into d when
// it streams.
func backend(m mode, client openai.Client, model string, d *deltas) llmretry.Backend[string, llmretry.Completion] {
	switch m {
	case stream:
		return openairetry.ChatStream(client, model, build, d.emit)
	case respPlain:
		return openairetry.Responses(client, model, buildResponses)
	case respStream:
		return openairetry.ResponsesStream(client, model, buildResponses, d.emit)
	}
	return openairetry.Chat(client, model, build)
}

// buffered returns the backend for model in streaming mode m with a nil
// emit, which holds its answer.
func buffered(m mode, client openai.Client, model string) llmretry.Backend[string, llmretry.Completion] {
	if m == respStream {
		return openairetry.ResponsesStream(client, model, buildResponses, nil)
	}
	return openairetry.ChatStream(client, model, build, nil)
}

// waits is a retry policy of n short waits.
func waits(n int) llmretry.Policy {
	return llmretry.Policy{Waits: slices.Repeat([]time.Duration{short}, n)}
}

// run sends one question through a chain of backends and returns the
// answer, the error, and every attempt as OnAttempt saw it.
func run(t *testing.T, backends ...llmretry.Backend[string, llmretry.Completion]) (llmretry.Completion, []llmretry.Attempt, error) {
	t.Helper()
	var attempts []llmretry.Attempt
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: backends,
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			attempts = append(attempts, a)
		},
	}
	// No deadline: with one, the default reserve would leave no time for
	// any wait, and the listed waits are the bound.
	answer, err := chain.Do(t.Context(), "Why is the sky blue?")
	if err != nil {
		// The error's records are the failed attempts OnAttempt saw.
		var ex *llmretry.Exhausted
		if !errors.As(err, &ex) {
			t.Fatalf("Do() error = %T %v, want an *llmretry.Exhausted", err, err)
		}
		if diff := cmp.Diff(attempts, ex.Attempts, cmpopts.EquateErrors()); diff != "" {
			t.Errorf("the error's records differ from OnAttempt's (-OnAttempt +error):\n%s", diff)
		}
	}
	return answer, attempts, err
}

// row is one attempt joined with the request the server logged for it.
type row struct {
	Model      string
	Try        int
	Step       string // the step the server played; "" when no request reached it
	OK         bool
	Kind       llmretry.Kind
	Status     int
	RetryAfter time.Duration
	Next       llmretry.Next
	Why        llmretry.Why
	RetryIn    time.Duration
	Delivered  bool
	Raw        *string
}

// joinLog checks the chain's records against the logs of the servers,
// request for request: every attempt that reached a server sent exactly
// one request, for its model and in its mode, while the attempt ran, and
// reports the usage the server told it; and every logged request belongs
// to an attempt. An attempt refused at
// connect (the server was down) reached none. It returns the attempts
// joined with their requests, for the test to compare.
func joinLog(t *testing.T, m mode, attempts []llmretry.Attempt, servers ...*llmretrytest.Server) []row {
	t.Helper()
	var log []llmretrytest.Request
	for _, srv := range servers {
		log = append(log, srv.Requests()...)
	}
	slices.SortStableFunc(log, func(a, b llmretrytest.Request) int { return a.Time.Compare(b.Time) })

	rows := make([]row, 0, len(attempts))
	reached := map[string]int{}
	for i, a := range attempts {
		r := row{
			Model: a.Model, Try: a.Try, OK: a.Err == nil, Kind: a.Kind, Status: a.Status,
			RetryAfter: a.RetryAfter, Next: a.Next, Why: a.Why, RetryIn: a.RetryIn,
			Delivered: a.Delivered, Raw: a.RawText,
		}
		if errors.Is(a.Err, syscall.ECONNREFUSED) {
			rows = append(rows, r)
			continue
		}
		if len(log) == 0 {
			t.Errorf("attempt %d (%v) has no request in the server log", i, a)
			continue
		}
		req := log[0]
		log = log[1:]
		reached[a.Model]++
		if req.Model != a.Model || req.N != reached[a.Model] || req.Stream != m.streams() || req.API != m.api() {
			t.Errorf("attempt %d (%v): logged request = %+v, want model %s, N %d, stream %v, api %s",
				i, a, req, a.Model, reached[a.Model], m.streams(), m.api())
		}
		if req.Time.Before(a.Start) || req.Time.After(a.Start.Add(a.Elapsed)) {
			t.Errorf("attempt %d (%v): request logged at %v, outside the attempt's %v + %v",
				i, a, req.Time, a.Start, a.Elapsed)
		}
		// What the attempt says it cost is what the server told it.
		var told *llmretry.Usage
		if req.Usage != nil {
			u := llmretry.Usage(*req.Usage)
			told = &u
		}
		if diff := cmp.Diff(told, a.Usage); diff != "" {
			t.Errorf("attempt %d (%v): usage differs from the server's log (-log +record):\n%s", i, a, diff)
		}
		r.Step = req.Step
		rows = append(rows, r)
	}
	for _, req := range log {
		t.Errorf("logged request %+v belongs to no attempt", req)
	}
	return rows
}

// answered is the row of a successful attempt: a stream that answers
// has delivered its text.
func answered(m mode, model string, try int) row {
	return row{Model: model, Try: try, Step: "answer", OK: true, Delivered: m.streams()}
}

// text returns a pointer to s, for rows' raw text.
func text(s string) *string { return &s }

func TestRetriesThenAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Status(503), llmretrytest.Status(503), llmretrytest.Answer("The sky is blue."))
			var d deltas
			a := backend(m, newClient(srv), "gpt-a", &d)
			a.Retry = waits(3)

			got, attempts, err := run(t, a)
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 503", Kind: llmretry.KindTransient, Status: 503, Next: llmretry.NextRetry, RetryIn: short},
				{Model: "gpt-a", Try: 2, Step: "status 503", Kind: llmretry.KindTransient, Status: 503, Next: llmretry.NextRetry, RetryIn: short},
				answered(m, "gpt-a", 3),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			wantAnswer := llmretry.Completion{
				ID: "chatcmpl-gpt-a-3", Model: "gpt-a", Text: "The sky is blue.", StopReason: "stop", InputTokens: 10, OutputTokens: 4,
			}
			if m.api() == "openai-responses" {
				wantAnswer.ID, wantAnswer.StopReason = "resp_gpt-a_3", "completed"
			}
			if diff := cmp.Diff(wantAnswer, got, cmpopts.IgnoreFields(llmretry.Completion{}, "Raw")); diff != "" {
				t.Errorf("Do() answer (-want +got):\n%s", diff)
			}
			switch raw := got.Raw.(type) {
			case *openai.ChatCompletion:
				if m.api() != "openai" || raw.Choices[0].Message.Content != got.Text || raw.Usage.CompletionTokens != 4 {
					t.Errorf("Do() answer Raw = %#v, want the *openai.ChatCompletion with the text and usage", got.Raw)
				}
			case *responses.Response:
				if m.api() != "openai-responses" || raw.OutputText() != got.Text || raw.Usage.OutputTokens != 4 {
					t.Errorf("Do() answer Raw = %#v, want the *responses.Response with the text and usage", got.Raw)
				}
			default:
				t.Errorf("Do() answer Raw = %T, want the SDK's response", got.Raw)
			}
			// The answer's record says what the server reported it cost;
			// the 503s reported nothing.
			wantUsage := []*llmretry.Usage{nil, nil, {InputTokens: 10, OutputTokens: 4}}
			var gotUsage []*llmretry.Usage
			for _, a := range attempts {
				gotUsage = append(gotUsage, a.Usage)
			}
			if diff := cmp.Diff(wantUsage, gotUsage); diff != "" {
				t.Errorf("records' usage (-want +got):\n%s", diff)
			}
			if m.streams() {
				if diff := cmp.Diff([]string{"The ", "sky ", "is ", "blue."}, d.all()); diff != "" {
					t.Errorf("emitted (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestRetryAfter checks that the server's wait is honoured when it is
// short, and ends the backend's retries when it is longer than MaxWait.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String()+"/honoured", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Status(429).WithHeader("retry-after-ms", "300"), llmretrytest.Answer("ok"))
			a := backend(m, newClient(srv), "gpt-a", &deltas{})
			a.Retry = waits(1)

			_, attempts, err := run(t, a)
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 429", Kind: llmretry.KindTransient, Status: 429,
					RetryAfter: 300 * time.Millisecond, Next: llmretry.NextRetry, RetryIn: 300 * time.Millisecond},
				answered(m, "gpt-a", 2),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			log := srv.Requests()
			if gap := log[1].Time.Sub(log[0].Time); gap < 300*time.Millisecond {
				t.Errorf("retry sent %v after the 429, want at least the 300ms it asked for", gap)
			}
		})
		t.Run(m.String()+"/beyond_max_wait", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Status(429).WithHeader("retry-after", "30"))
			srv.Script("gpt-b", llmretrytest.Answer("ok"))
			client := newClient(srv)
			a := backend(m, client, "gpt-a", &deltas{})
			a.Retry = waits(3)
			a.Retry.MaxWait = time.Second

			start := time.Now()
			_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			// Only a wait of 30 s could take this long; the fail-over is at once.
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("Do() took %v, want a fail-over without the 30s wait", took)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 429", Kind: llmretry.KindTransient, Status: 429,
					RetryAfter: 30 * time.Second, Next: llmretry.NextFailOver, Why: llmretry.WhyMaxWait},
				answered(m, "gpt-b", 1),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTransientRetried runs through every failure that may pass before an
// answer: server errors, an error event inside the stream (a 5xx of the
// same type for a plain request), a connection closed without a response
// and a body or event that does not decode.
func TestTransientRetried(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a",
				llmretrytest.Status(500),
				llmretrytest.Status(503),
				llmretrytest.Status(529),
				llmretrytest.StreamError("server_error"),
				llmretrytest.StreamError("overloaded_error"),
				llmretrytest.Hangup(),
				llmretrytest.Malformed(),
				llmretrytest.Answer("ok"),
			)
			a := backend(m, newClient(srv), "gpt-a", &deltas{})
			a.Retry = waits(7)

			_, attempts, err := run(t, a)
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			transient := func(try int, step string, status int) row {
				return row{Model: "gpt-a", Try: try, Step: step, Kind: llmretry.KindTransient, Status: status, Next: llmretry.NextRetry, RetryIn: short}
			}
			want := []row{
				transient(1, "status 500", 500),
				transient(2, "status 503", 503),
				transient(3, "status 529", 529),
				transient(4, "stream error server_error", 500),
				transient(5, "stream error overloaded_error", 529),
				transient(6, "hangup", 0),
				transient(7, "malformed", 0),
				answered(m, "gpt-a", 8),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRejectedFailsOver checks that an exhausted quota and a prompt too
// long for the model are not retried, and that the chain advises against
// re-running an item that every backend refused.
func TestRejectedFailsOver(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String()+"/everywhere", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.InsufficientQuota())
			srv.Script("gpt-b", llmretrytest.ContextLengthExceeded())
			client := newClient(srv)
			a := backend(m, client, "gpt-a", &deltas{})
			a.Retry = waits(3)
			b := backend(m, client, "gpt-b", &deltas{})
			b.Retry = waits(3)

			_, attempts, err := run(t, a, b)
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 429 insufficient_quota", Kind: llmretry.KindRejected, Status: 429,
					Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
				{Model: "gpt-b", Try: 1, Step: "status 400 context_length_exceeded", Kind: llmretry.KindRejected, Status: 400,
					Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable},
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if llmretry.RetryItem(err) {
				t.Errorf("RetryItem(%v) = true, want false: every backend refused the request", err)
			}
			// The records say why, in the provider's words.
			for i, want := range []string{
				"code insufficient_quota, request req_gpt-a_1",
				"code context_length_exceeded, request req_gpt-b_1",
			} {
				if i >= len(attempts) {
					break // the records' diff above has said what is missing
				}
				if msg := fmt.Sprint(attempts[i].Err); !strings.Contains(msg, want) {
					t.Errorf("attempt %d error = %q, want it to contain %q", i, msg, want)
				}
			}
		})
		t.Run(m.String()+"/one_backend", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.InsufficientQuota())
			srv.Script("gpt-b", llmretrytest.Status(503))
			client := newClient(srv)
			a := backend(m, client, "gpt-a", &deltas{})
			a.Retry = waits(3)

			_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 429 insufficient_quota", Kind: llmretry.KindRejected, Status: 429,
					Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
				{Model: "gpt-b", Try: 1, Step: "status 503", Kind: llmretry.KindTransient, Status: 503,
					Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			// gpt-b may be back tomorrow: the item is worth another run.
			if !llmretry.RetryItem(err) {
				t.Errorf("RetryItem(%v) = false, want true: one backend failed only for now", err)
			}
		})
	}
}

// TestTruncation checks that an answer cut off at its token budget is not
// retried and keeps its partial text in the record. A plain request falls
// over to the next backend; a stream that already delivered the text
// cannot, and ends the chain.
func TestTruncation(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Truncated("The sky is"))
			srv.Script("gpt-b", llmretrytest.Answer("ok"))
			client := newClient(srv)
			a := backend(m, client, "gpt-a", &deltas{})
			a.Retry = waits(3)

			_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "truncated", Kind: llmretry.KindTruncated, Raw: text("The sky is"),
					Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
				answered(m, "gpt-b", 1),
			}
			if len(attempts) > 0 {
				want := `finish reason "length") (request req_gpt-a_1)`
				if m.api() == "openai-responses" {
					want = `reason "max_output_tokens") (request req_gpt-a_1)`
				}
				if msg := fmt.Sprint(attempts[0].Err); !strings.Contains(msg, want) {
					t.Errorf("attempt 1 error = %q, want it to contain %q", msg, want)
				}
				// A truncated answer is billed: its record says for what.
				if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 3}, attempts[0].Usage); diff != "" {
					t.Errorf("attempt 1 usage (-want +got):\n%s", diff)
				}
			}
			if m.streams() {
				// The caller holds "The sky is" already.
				want = want[:1]
				want[0].Delivered, want[0].Next, want[0].Why = true, llmretry.NextStop, llmretry.WhyDelivered
				if _, ok := errors.AsType[*llmretry.Truncated](err); !ok {
					t.Errorf("Do() error = %T %v, want an *llmretry.Truncated", err, err)
				}
			} else if err != nil {
				t.Errorf("Do() error = %v, want nil", err)
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEmptyAnswerRetried checks that an answer with no text and no tool
// call is a parse failure, which is retried since sampling differs.
func TestEmptyAnswerRetried(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Answer(""), llmretrytest.Answer("ok"))
			a := backend(m, newClient(srv), "gpt-a", &deltas{})
			a.Retry = waits(1)

			_, attempts, err := run(t, a)
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "answer", Kind: llmretry.KindParse, Next: llmretry.NextRetry, RetryIn: short, Raw: text("")},
				answered(m, "gpt-a", 2),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStreamBroken checks streams that fail partway: once text has been
// delivered the failure ends the chain with nothing resent and no other
// backend called; before any text (the opening role chunk is not text) it
// is retried like any request. A stream that ends without a finish reason
// is a failure, never a success. A plain request cut off the same way, or
// answered without a finish reason, is always retried.
func TestStreamBroken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mode    mode
		step    llmretrytest.Step
		nilEmit bool
		want    row // gpt-a's first record
		emitted []string
	}{
		{
			name: "cut_after_text", mode: stream, step: llmretrytest.StreamDrop(1),
			want:    row{Step: "stream drop 1", Kind: llmretry.KindTransient, Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true, Raw: text("chunk1 ")},
			emitted: []string{"chunk1 "},
		},
		{
			// Nobody holds the text of a buffered stream: it is sent again.
			name: "cut_after_progress_nil_emit", mode: stream, step: llmretrytest.StreamDrop(2), nilEmit: true,
			want: row{Step: "stream drop 2", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short, Raw: text("chunk1 chunk2 ")},
		},
		{
			name: "unfinished_after_text", mode: stream, step: llmretrytest.StreamUnfinished(2),
			want:    row{Step: "stream unfinished 2", Kind: llmretry.KindTransient, Next: llmretry.NextStop, Why: llmretry.WhyDelivered, Delivered: true, Raw: text("chunk1 chunk2 ")},
			emitted: []string{"chunk1 ", "chunk2 "},
		},
		{
			name: "error_event_after_open", mode: stream, step: llmretrytest.StreamError("server_error"),
			want: row{Step: "stream error server_error", Kind: llmretry.KindTransient, Status: 500, Next: llmretry.NextRetry, RetryIn: short},
		},
		{
			name: "cut_before_text", mode: stream, step: llmretrytest.StreamDrop(0),
			want: row{Step: "stream drop 0", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short},
		},
		{
			name: "unfinished_before_text", mode: stream, step: llmretrytest.StreamUnfinished(0),
			want: row{Step: "stream unfinished 0", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short},
		},
		{
			name: "json_unfinished", mode: plain, step: llmretrytest.StreamUnfinished(2),
			want: row{Step: "stream unfinished 2", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short, Raw: text("chunk1 chunk2 ")},
		},
		{
			name: "json_cut", mode: plain, step: llmretrytest.StreamDrop(2),
			want: row{Step: "stream drop 2", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short},
		},
	}
	for _, api := range apis {
		for _, tc := range tests {
			m := tc.mode.in(api)
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", tc.step, llmretrytest.Answer("ok"))
				srv.Script("gpt-b", llmretrytest.Answer("ok"))
				client := newClient(srv)
				var d deltas
				a := backend(m, client, "gpt-a", &d)
				if tc.nilEmit {
					a = buffered(m, client, "gpt-a")
				}
				a.Retry = waits(1)

				_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
				first := tc.want
				first.Model, first.Try = "gpt-a", 1
				want := []row{first}
				if tc.want.Delivered {
					if err == nil {
						t.Errorf("Do() error = nil, want the failure of the delivered stream")
					}
				} else {
					if err != nil {
						t.Errorf("Do() error = %v, want nil", err)
					}
					second := answered(m, "gpt-a", 2)
					second.Delivered = second.Delivered && !tc.nilEmit
					want = append(want, second)
				}
				if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if tc.want.Delivered {
					if diff := cmp.Diff(tc.emitted, d.all()); diff != "" {
						t.Errorf("emitted (-want +got):\n%s", diff)
					}
				}
			})
		}
	}
}

// TestStall checks that an attempt that hangs is ended by the backend's
// Timeout and retried.
func TestStall(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.StallHeaders(), llmretrytest.Answer("ok"))
			a := backend(m, newClient(srv), "gpt-a", &deltas{})
			a.Retry = waits(1)
			a.Timeout = 200 * time.Millisecond

			_, attempts, err := run(t, a)
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "stall headers", Kind: llmretry.KindTimeout, Next: llmretry.NextRetry, RetryIn: short},
				answered(m, "gpt-a", 2),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStallTimeout checks that StallTimeout ends an attempt that goes
// quiet, measured from each piece of text the stream delivers: a stream
// that keeps sending outlives it, one that stalls before any text is
// retried, and one that stalls after text ends the chain. A plain request
// delivers nothing, so StallTimeout bounds all of it.
func TestStallTimeout(t *testing.T) {
	t.Parallel()
	const stall = 250 * time.Millisecond
	tests := []struct {
		name string
		mode mode
		step llmretrytest.Step
		want row // gpt-a's first record
	}{
		{
			name: "slow_but_steady", mode: stream,
			// 8 chunks 50ms apart outlast the stall timeout twice over.
			step: llmretrytest.Answer("one two three four five six seven eight").Every(50 * time.Millisecond),
			want: answered(stream, "gpt-a", 1),
		},
		{
			name: "before_text", mode: stream, step: llmretrytest.StreamStall(0),
			want: row{Step: "stream stall 0", Kind: llmretry.KindTimeout, Next: llmretry.NextRetry, RetryIn: short},
		},
		{
			name: "after_text", mode: stream, step: llmretrytest.StreamStall(1),
			want: row{Step: "stream stall 1", Kind: llmretry.KindTimeout, Next: llmretry.NextStop, Why: llmretry.WhyDelivered,
				Delivered: true, Raw: text("chunk1 ")},
		},
		{
			name: "json", mode: plain, step: llmretrytest.StreamStall(0),
			want: row{Step: "stream stall 0", Kind: llmretry.KindTimeout, Next: llmretry.NextRetry, RetryIn: short},
		},
	}
	for _, api := range apis {
		for _, tc := range tests {
			m := tc.mode.in(api)
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", tc.step, llmretrytest.Answer("ok"))
				srv.Script("gpt-b", llmretrytest.Answer("ok"))
				client := newClient(srv)
				a := backend(m, client, "gpt-a", &deltas{})
				a.Retry = waits(1)
				a.StallTimeout = stall

				_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
				first := tc.want
				first.Model, first.Try = "gpt-a", 1
				want := []row{first}
				switch {
				case first.OK:
				case first.Delivered:
					if _, ok := errors.AsType[*llmretry.TimedOut](err); !ok {
						t.Errorf("Do() error = %T %v, want an *llmretry.TimedOut", err, err)
					}
				default:
					want = append(want, answered(m, "gpt-a", 2))
				}
				if !first.Delivered && err != nil {
					t.Errorf("Do() error = %v, want nil", err)
				}
				if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if !first.OK && len(attempts) > 0 {
					if took := attempts[0].Elapsed; took < stall {
						t.Errorf("stalled attempt took %v, want at least the %v stall timeout", took, stall)
					}
				}
			})
		}
	}
}

// TestOneRequestPerAttempt checks that the SDK's own retries are off
// whatever the client was built with: a server that fails forever sees
// exactly one request per attempt the chain records.
func TestOneRequestPerAttempt(t *testing.T) {
	t.Parallel()
	clients := []struct {
		name string
		opts []option.RequestOption
	}{
		{"default_retries", nil},
		{"five_retries", []option.RequestOption{option.WithMaxRetries(5)}},
	}
	for _, m := range modes {
		for _, c := range clients {
			t.Run(m.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", llmretrytest.Status(503))
				a := backend(m, newClient(srv, c.opts...), "gpt-a", &deltas{})
				a.Retry = waits(2)

				_, attempts, err := run(t, a)
				if err == nil {
					t.Fatal("Do() error = nil, want the 503s")
				}
				want := []row{
					{Model: "gpt-a", Try: 1, Step: "status 503", Kind: llmretry.KindTransient, Status: 503, Next: llmretry.NextRetry, RetryIn: short},
					{Model: "gpt-a", Try: 2, Step: "status 503", Kind: llmretry.KindTransient, Status: 503, Next: llmretry.NextRetry, RetryIn: short},
					{Model: "gpt-a", Try: 3, Step: "status 503", Kind: llmretry.KindTransient, Status: 503,
						Next: llmretry.NextStop, Why: llmretry.WhyWaitsUsed},
				}
				if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestConnectionRefused checks that a provider that is down is transient:
// retried, then failed over from.
func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			down := newServer(t)
			// The first request sees its connection closed and takes the
			// server down; the retry is refused at connect.
			down.Script("gpt-a", llmretrytest.Down())
			up := newServer(t)
			up.Script("gpt-b", llmretrytest.Answer("ok"))
			a := backend(m, newClient(down), "gpt-a", &deltas{})
			a.Retry = waits(1)

			_, attempts, err := run(t, a, backend(m, newClient(up), "gpt-b", &deltas{}))
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "down", Kind: llmretry.KindTransient, Next: llmretry.NextRetry, RetryIn: short},
				{Model: "gpt-a", Try: 2, Kind: llmretry.KindTransient, Next: llmretry.NextFailOver, Why: llmretry.WhyWaitsUsed},
				answered(m, "gpt-b", 1),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, down, up)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if !errors.Is(attempts[1].Err, syscall.ECONNREFUSED) {
				t.Errorf("attempt 2 error = %v, want a refused connection", attempts[1].Err)
			}
		})
	}
}

// TestModelFromParams checks that an empty model leaves the one build put
// in the parameters.
func TestModelFromParams(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("not-scripted", llmretrytest.Answer("ok"))
			b := backend(m, newClient(srv), "", &deltas{})
			got, err := b.Call(t.Context(), "hi")
			if err != nil || got.Text != "ok" || got.Model != "not-scripted" {
				t.Errorf("Call() = %+v, %v; want the answer of the params' model", got, err)
			}
		})
	}
}

// TestTextOnStreamFailureKept checks the raw text of a stream broken by a
// transport error is kept, and the error still reads as that transport
// error to errors.Is.
func TestTextOnStreamFailureKept(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("gpt-a", llmretrytest.StreamDrop(1))
	b := openairetry.ChatStream(newClient(srv), "gpt-a", build, nil)
	_, err := b.Call(t.Context(), "hi")
	f, ok := errors.AsType[*llmretry.Failure](err)
	if !ok || f.RawText == nil || *f.RawText != "chunk1 " || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Call() error = %#v, want a Failure with raw text %q over io.ErrUnexpectedEOF", err, "chunk1 ")
	}
	if want := "request req_gpt-a_1"; !strings.Contains(err.Error(), want) {
		t.Errorf("Call() error = %q, want it to name %q", err, want)
	}
}
