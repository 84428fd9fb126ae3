package anthropicretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
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

// stall is the StallTimeout of the tests that set one: long enough that
// a loaded machine running -race still delivers a chunk within it, short
// enough for a quick suite.
const stall = 500 * time.Millisecond

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
	var records []llmretry.Attempt
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends:  backends,
		OnAttempt: func(_ context.Context, a llmretry.Attempt) { records = append(records, a) },
	}
	answer, err := chain.Do(ctx, "Say hello.")
	return answer, records, err
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
		llmretrytest.CheckLog(t, records, err, srv) // and no request was sent
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
		llmretrytest.CheckLog(t, records, err, srv)
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
		llmretrytest.CheckLog(t, records, err, srv)
	})
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

// A backend's own emit gets every piece of text as it arrives, as the
// call's stream does when there is one; a failure after text ends the
// chain with what was handed over.
func TestEmit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		steps   []llmretrytest.Step
		emitted []string
		kinds   []string
	}{
		{"answer", []llmretrytest.Step{llmretrytest.Answer("Hello there, friend.")}, []string{"Hello ", "there, ", "friend."}, []string{"claude-a ok"}},
		{"cut_after_text", []llmretrytest.Step{llmretrytest.StreamDrop(2), llmretrytest.Answer("ok")}, []string{"chunk1 ", "chunk2 "}, []string{"claude-a transient"}},
	}
	for _, tc := range tests {
		for _, streamed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/streamed=%v", tc.name, streamed), func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("claude-a", tc.steps...)
				var emitted, chunks []string
				ctx := t.Context()
				if streamed {
					ctx = llmretry.WithStream(ctx, func(c llmretry.Chunk) { chunks = append(chunks, c.Text) })
				}
				_, records, err := run(ctx, streamMode.backend(newClient(srv), "claude-a", tiny, &emitted))
				if diff := cmp.Diff(tc.emitted, emitted); diff != "" {
					t.Errorf("emitted (-want +got):\n%s", diff)
				}
				if streamed {
					if diff := cmp.Diff(tc.emitted, chunks); diff != "" {
						t.Errorf("the call's stream (-want +got):\n%s", diff)
					}
				}
				checkKinds(t, records, tc.kinds...)
				llmretrytest.CheckLog(t, records, err, srv)
			})
		}
	}
}
