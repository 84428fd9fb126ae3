package openairetry_test

import (
	"context"
	"errors"
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
