package openairetry_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// hold ends a rawServer body that is kept open once it is sent, as a
// server that never sends its last bytes does; hold itself is not sent.
const hold = "\x00hold"

// cutOff ends a rawServer body whose connection is cut once it is sent.
const cutOff = "\x00cut"

// rawServer answers the n-th request (from 0) with bodies[n] as an event
// stream (as JSON when it starts with "{"), the last body again once they run out. It returns a client for
// it and a count of the requests it got. It serves what llmretrytest's
// steps do not play: events garbled mid-stream and streams that stay
// open after their answer.
func rawServer(t *testing.T, bodies ...string) (openai.Client, func() int) {
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
		if strings.HasPrefix(body, "{") {
			w.Header().Set("Content-Type", "application/json") // a plain answer's body
		} else {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		body, held := strings.CutSuffix(body, hold)
		body, cut := strings.CutSuffix(body, cutOff)
		_, _ = w.Write([]byte(body))
		w.(http.Flusher).Flush()
		if held {
			<-r.Context().Done()
		}
		if cut {
			panic(http.ErrAbortHandler) // the connection is cut mid-body
		}
	}))
	t.Cleanup(srv.Close)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(testKey))
	return client, func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// data is one unnamed SSE event, as Chat Completions sends them.
func data(json string) string { return "data: " + json + "\n\n" }

// event is one named SSE event, as the Responses API sends them.
func event(name, json string) string { return "event: " + name + "\ndata: " + json + "\n\n" }

func chunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return data(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-a","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}]}`)
}

var (
	chatRole   = chunk(`{"role":"assistant","content":""}`, "")
	chatHello  = chunk(`{"content":"Hello"}`, "")
	chatFinish = chunk(`{}`, "stop")
	chatUsage  = data(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-a","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	chatDone   = data(`[DONE]`)
	// chatGarbled is a chunk cut off in the middle of its JSON, as a
	// proxy that mangles a chunk sends it.
	chatGarbled = data(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"wor`)

	respCreated = event("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"r1","object":"response","model":"gpt-a","status":"in_progress","output":[]}}`)
	respHello   = event("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":1,"item_id":"m1","output_index":0,"content_index":0,"delta":"Hello","logprobs":[]}`)
	respDone    = event("response.completed", `{"type":"response.completed","sequence_number":2,"response":{"id":"r1","object":"response","model":"gpt-a","status":"completed",`+
		`"output":[{"type":"message","id":"m1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],`+
		`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":11}}}`)
	respGarbled = event("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":2,"delta":"wor`)
)

// nullUsage is a chat chunk as OpenAI sends it with include_usage set:
// with "usage": null until the last.
func nullUsage(chunk string) string { return strings.Replace(chunk, `}]}`, `}],"usage":null}`, 1) }

// An event that does not decode in the middle of a stream is a transient
// failure: a held answer is sent again, a delivered one ends the chain
// with an error that says what happened.
func TestMalformedEventMidStream(t *testing.T) {
	t.Parallel()
	bodies := map[mode][2]string{ // garbled, then whole
		stream:     {chatRole + chatHello + chatGarbled, chatRole + chatHello + chatFinish + chatUsage + chatDone},
		respStream: {respCreated + respHello + respGarbled, respCreated + respHello + respDone},
	}
	for _, m := range []mode{stream, respStream} {
		for _, held := range []bool{false, true} {
			name := m.String()
			if held {
				name += "/nil_emit"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				client, requests := rawServer(t, bodies[m][0], bodies[m][1])
				var d deltas
				a := backend(m, client, "gpt-a", &d)
				if held {
					a = buffered(m, client, "gpt-a")
				}
				a.Retry = waits(1)

				answer, attempts, err := run(t, a)
				if len(attempts) == 0 {
					t.Fatalf("Do() = %v with no records", err)
				}
				first := attempts[0]
				if first.Kind != llmretry.KindTransient || first.Delivered == held {
					t.Errorf("record 1 = %v, want transient with Delivered %v", first, !held)
				}
				if msg, want := fmt.Sprint(first.Err), "stream sent an event that does not decode"; !strings.Contains(msg, want) {
					t.Errorf("record 1 error = %q, want it to contain %q", msg, want)
				}
				if held {
					if err != nil || answer.Text != "Hello" || requests() != 2 {
						t.Errorf("Do() = %q, %v after %d requests; want the resent answer after 2", answer.Text, err, requests())
					}
					return
				}
				if err == nil || requests() != 1 {
					t.Errorf("Do() error = %v after %d requests; want the delivered stream's failure after 1", err, requests())
				}
				if diff := cmp.Diff([]string{"Hello"}, d.all()); diff != "" {
					t.Errorf("emitted (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// A stream that has sent its whole answer is answered then, without
// waiting for the [DONE] (or end of body) that never comes: the Timeout,
// which would end a stream that waited, is never reached. A chat stream
// whose usage never comes either is answered a moment later, its usage
// unknown.
func TestFinishedStreamAnswersAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		mode  mode
		body  string
		usage *llmretry.Usage
	}{
		{"chat", stream, chatRole + chatHello + chatFinish + chatUsage + hold, &llmretry.Usage{InputTokens: 10, OutputTokens: 1}},
		{"chat_no_usage", stream, chatRole + chatHello + chatFinish + hold, nil},
		// OpenAI sends "usage": null in every chunk before the last.
		{"chat_usage_null", stream, nullUsage(chatRole) + nullUsage(chatHello) + nullUsage(chatFinish) + chatUsage + hold, &llmretry.Usage{InputTokens: 10, OutputTokens: 1}},
		{"responses", respStream, respCreated + respHello + respDone + hold, &llmretry.Usage{InputTokens: 10, OutputTokens: 1}},
	}
	for _, tc := range tests {
		for _, held := range []bool{false, true} {
			name := tc.name
			if held {
				name += "/nil_emit"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				client, requests := rawServer(t, tc.body)
				a := backend(tc.mode, client, "gpt-a", &deltas{})
				if held {
					a = buffered(tc.mode, client, "gpt-a")
				}
				// Far longer than the wait for a usage chunk, so that only
				// a stream that waits for its end reaches it.
				a.Timeout = 5 * time.Second

				answer, attempts, err := run(t, a)
				if err != nil || answer.Text != "Hello" || requests() != 1 {
					t.Fatalf("Do() = %q, %v after %d requests; want the answer of the one stream", answer.Text, err, requests())
				}
				if diff := cmp.Diff(tc.usage, attempts[0].Usage); diff != "" {
					t.Errorf("record's usage (-want +got):\n%s", diff)
				}
				// An attempt that waited for the end would have lasted its
				// whole Timeout, and its answer been taken only then.
				if took := attempts[0].Elapsed; took >= a.Timeout {
					t.Errorf("attempt took %v, want it answered before its %v Timeout", took, a.Timeout)
				}
			})
		}
	}
}

// A held stream that stalls after some progress is retried: StallTimeout
// ends it, and since nobody has its text it is sent again.
func TestBufferedStallResent(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{stream, respStream} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.StreamStall(2), llmretrytest.Answer("ok"))
			a := buffered(m, newClient(srv), "gpt-a")
			a.Retry = waits(1)
			a.StallTimeout = 250 * time.Millisecond

			answer, attempts, err := run(t, a)
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want the retry's answer", answer.Text, err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "stream stall 2", Kind: llmretry.KindTimeout, Next: llmretry.NextRetry, RetryIn: short, Raw: text("chunk1 chunk2 ")},
				{Model: "gpt-a", Try: 2, Step: "answer", OK: true},
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// Every mode reports the usage the server sent, cached and reasoning
// tokens included, in the answer's record.
func TestUsageDetails(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.Answer("Rayleigh scattering.").WithUsageDetails(7, 1))
			_, attempts, err := run(t, backend(m, newClient(srv), "gpt-a", &deltas{}))
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := &llmretry.Usage{InputTokens: 10, OutputTokens: 2, CachedInputTokens: 7, ReasoningTokens: 1}
			if diff := cmp.Diff(want, attempts[0].Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
		})
	}
}

// A plain answer whose body is not JSON, as a proxy's error page or a
// mangled body is, is transient: the next try is likely to read whole.
func TestGarbledBodyRetried(t *testing.T) {
	t.Parallel()
	whole := map[mode]string{
		plain: `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-a","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}`,
		respPlain: `{"id":"r1","object":"response","model":"gpt-a","status":"completed",` +
			`"output":[{"type":"message","id":"m1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}]}`,
	}
	for _, m := range []mode{plain, respPlain} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			client, requests := rawServer(t, `{"id": garbled}`, whole[m])
			a := backend(m, client, "gpt-a", &deltas{})
			a.Retry = waits(1)
			answer, attempts, err := run(t, a)
			if err != nil || answer.Text != "Hello" || requests() != 2 {
				t.Fatalf("Do() = %q, %v after %d requests; want the retry's answer after 2", answer.Text, err, requests())
			}
			if k := attempts[0].Kind; k != llmretry.KindTransient {
				t.Errorf("record 1 kind = %v, want transient", k)
			}
		})
	}
}

// A stream cut after it reported usage, as providers that count every
// chunk do, keeps that usage in its record: the provider bills it.
func TestCutStreamKeepsUsage(t *testing.T) {
	t.Parallel()
	counted := chunk(`{"content":"Hello"}`, "")
	counted = strings.Replace(counted, `}]}`, `}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`, 1)
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("nil_emit_%v", held), func(t *testing.T) {
			t.Parallel()
			client, _ := rawServer(t, chatRole+counted+cutOff)
			a := backend(stream, client, "gpt-a", &deltas{})
			if held {
				a = buffered(stream, client, "gpt-a")
			}
			_, attempts, err := run(t, a)
			if err == nil || len(attempts) != 1 {
				t.Fatalf("Do() = %v with %d records, want the cut stream's failure", err, len(attempts))
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 1}, attempts[0].Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
		})
	}
}

// A response whose only output is a call of the caller's function is an
// answer; one whose only output is a tool OpenAI ran itself has answered
// nothing, and is tried again.
func TestResponsesFunctionCall(t *testing.T) {
	t.Parallel()
	response := func(item string) string {
		return `{"id":"r1","object":"response","model":"gpt-a","status":"completed","output":[` + item + `],` +
			`"usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15}}`
	}
	call := response(`{"type":"function_call","id":"fc1","call_id":"call_1","name":"weather","arguments":"{}","status":"completed"}`)
	search := response(`{"type":"web_search_call","id":"ws1","status":"completed"}`)
	tests := []struct {
		name   string
		bodies []string
		kinds  []llmretry.Kind
	}{
		{"function_call", []string{call}, []llmretry.Kind{llmretry.KindUnknown}},
		{"web_search_only", []string{search, call}, []llmretry.Kind{llmretry.KindParse, llmretry.KindUnknown}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client, _ := rawServer(t, tc.bodies...)
			a := backend(respPlain, client, "gpt-a", &deltas{})
			a.Retry = waits(1)
			answer, attempts, err := run(t, a)
			if err != nil || answer.Text != "" {
				t.Fatalf("Do() = %q, %v; want the function call's answer", answer.Text, err)
			}
			var kinds []llmretry.Kind
			for _, a := range attempts {
				kinds = append(kinds, a.Kind)
			}
			if diff := cmp.Diff(tc.kinds, kinds); diff != "" {
				t.Errorf("records' kinds (-want +got):\n%s", diff)
			}
		})
	}
}
