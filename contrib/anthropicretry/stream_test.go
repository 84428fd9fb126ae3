package anthropicretry_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A buffered stream (nil emit) holds its text until the answer is whole,
// so a stream cut after text has reached no one: it is sent again, and
// then taken to the next backend, as a plain request would be.
func TestBufferedStreamCutIsResent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a    []llmretrytest.Step // claude-a's script
		want []string            // the records' kinds
	}{
		{"retried", []llmretrytest.Step{llmretrytest.StreamDrop(2), llmretrytest.Answer("ok")},
			[]string{"claude-a transient", "claude-a ok"}},
		{"failed_over", []llmretrytest.Step{llmretrytest.StreamDrop(2)},
			[]string{"claude-a transient", "claude-a transient", "claude-a transient", "claude-b ok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("claude-a", tc.a...)
			srv.Script("claude-b", llmretrytest.Answer("ok"))
			client := newClient(srv)
			answer, records, err := run(t.Context(),
				bufferedMode.backend(client, "claude-a", tiny, nil),
				bufferedMode.backend(client, "claude-b", tiny, nil))
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the answer after the cut stream", answer.Text, err)
			}
			checkKinds(t, records, tc.want...)
			for i, a := range records {
				if a.Delivered {
					t.Errorf("record %d: Delivered = true, want false: a buffered stream delivers nothing", i)
				}
			}
			if raw := records[0].RawText; raw == nil || *raw != "chunk1 chunk2 " {
				t.Errorf("cut stream's RawText = %v, want %q", raw, "chunk1 chunk2 ")
			}
			llmretrytest.CheckLog(t, records, err, srv)
		})
	}
}

// sse is one Anthropic stream event as the wire carries it.
func sse(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }

var (
	evStart = sse("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-a",`+
		`"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`)
	evBlock     = sse("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	evHello     = sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`)
	evBlockStop = sse("content_block_stop", `{"type":"content_block_stop","index":0}`)
	evEnd       = sse("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":1}}`)
	evStop      = sse("message_stop", `{"type":"message_stop"}`)
	// evGarbled is a delta cut off in the middle of its JSON, as a proxy
	// that mangles a chunk sends it.
	evGarbled = sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_del`)
)

// rawServer answers the n-th request (from 0) with bodies[n] as an event
// stream, the last body again once they run out. A body that ends in
// hold is sent, and the response then kept open until the client goes
// away; hold itself is not sent.
func rawServer(t *testing.T, bodies ...string) (anthropic.Client, func() int) {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		body := bodies[min(n, len(bodies)-1)]
		n++
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		body, held := strings.CutSuffix(body, hold)
		w.Write([]byte(body))
		w.(http.Flusher).Flush()
		if held {
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	client := anthropic.NewClient(option.WithBaseURL(srv.URL+"/"), option.WithAPIKey(fakeKey))
	return client, func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// hold ends a rawServer body that is kept open after it is sent.
const hold = "\x00hold"

// An event that does not decode in the middle of a stream is a transient
// failure: a held answer is sent again, a delivered one ends the chain
// with an error that says what happened.
func TestMalformedEventMidStream(t *testing.T) {
	t.Parallel()
	garbled := evStart + evBlock + evHello + evGarbled
	whole := evStart + evBlock + evHello + evBlockStop + evEnd + evStop
	for _, m := range []mode{streamMode, bufferedMode} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			client, requests := rawServer(t, garbled, whole)
			answer, records, err := run(t.Context(), m.backend(client, "claude-a", tiny, nil))
			if m.delivers() {
				if err == nil {
					t.Fatalf("Do() = %q, want the garbled stream's error: its text was delivered", answer.Text)
				}
				checkKinds(t, records, "claude-a transient")
				if got := records[0].Why; got != llmretry.WhyDelivered {
					t.Errorf("record's Why = %q, want %q", got, llmretry.WhyDelivered)
				}
			} else {
				if err != nil || answer.Text != "Hello" {
					t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
				}
				checkKinds(t, records, "claude-a transient", "claude-a ok")
			}
			if msg := records[0].Err.Error(); !strings.Contains(msg, "anthropicretry: malformed stream event") {
				t.Errorf("record's error = %q, want it to name the malformed event", msg)
			}
			if raw := records[0].RawText; raw == nil || *raw != "Hello" {
				t.Errorf("RawText = %v, want %q", raw, "Hello")
			}
			if got, want := requests(), len(records); got != want {
				t.Errorf("server got %d requests, want %d", got, want)
			}
		})
	}
}

// A stream whose message_delta brings the stop_reason is whole: the
// answer stands without message_stop, whether the stream then ends or is
// kept open.
func TestStreamWithoutMessageStop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{"ends", evStart + evBlock + evHello + evBlockStop + evEnd},
		{"kept_open", evStart + evBlock + evHello + evBlockStop + evEnd + hold},
	}
	for _, m := range []mode{streamMode, bufferedMode} {
		for _, tc := range tests {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				client, requests := rawServer(t, tc.body)
				b := m.backend(client, "claude-a", tiny, nil)
				// The bound, not a measure: a Backend that waited for
				// message_stop on the open stream would time out, and
				// the records would say so.
				b.Timeout = 5 * time.Second
				answer, records, err := run(t.Context(), b)
				if err != nil {
					t.Fatalf("Do() = %v, want the answer", err)
				}
				// Raw is finished as message_stop would have finished it:
				// its JSON holds the streamed text.
				if msg, ok := answer.Raw.(*anthropic.Message); !ok || !strings.Contains(msg.RawJSON(), `"text":"Hello"`) {
					t.Errorf("Completion.Raw = %#v, want an *anthropic.Message whose JSON holds the text", answer.Raw)
				}
				answer.Raw = nil
				want := llmretry.Completion{ID: "msg_1", Model: "claude-a", Text: "Hello", StopReason: "end_turn", InputTokens: 10, OutputTokens: 1}
				if diff := cmp.Diff(want, answer); diff != "" {
					t.Errorf("Do() answer (-want +got):\n%s", diff)
				}
				checkKinds(t, records, "claude-a ok")
				if got := requests(); got != 1 {
					t.Errorf("server got %d requests, want 1", got)
				}
			})
		}
	}
}

// The SDK hands over a stream whose message_start is garbled as an error
// of its own; the Backend calls it malformed too.
func TestMalformedFirstEventNamed(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Script("claude-a", llmretrytest.Malformed())
	_, records, err := run(t.Context(), bufferedMode.backend(newClient(srv), "claude-a", llmretry.Policy{}, nil))
	if !errors.As(err, new(*llmretry.Exhausted)) {
		t.Fatalf("Do() = %v, want an *llmretry.Exhausted", err)
	}
	checkKinds(t, records, "claude-a transient")
	if msg := records[0].Err.Error(); !strings.Contains(msg, "anthropicretry: malformed stream event") {
		t.Errorf("record's error = %q, want it to name the malformed event", msg)
	}
	llmretrytest.CheckLog(t, records, err, srv)
}
