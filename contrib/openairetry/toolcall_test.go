package openairetry_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// weatherArgs are a tool call's arguments, eight chunks as the scripted
// server streams them.
const weatherArgs = `{"city": "Paris", "unit": "celsius", "days": 3, "hourly": false}`

// A tool call is an answer, in every mode: no text, nothing delivered,
// the call in Raw and its cost in the record.
func TestToolCallAnswers(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.ToolCall("get_weather", weatherArgs))
			var d deltas
			answer, attempts, err := run(t, backend(m, newClient(srv), "gpt-a", &d))
			if err != nil {
				t.Fatalf("Do() error = %v, want nil", err)
			}
			want := []row{{Model: "gpt-a", Try: 1, Step: "tool call get_weather", OK: true}}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(&llmretry.Usage{InputTokens: 10, OutputTokens: 8}, attempts[0].Usage); diff != "" {
				t.Errorf("record's usage (-want +got):\n%s", diff)
			}
			if answer.Text != "" || len(d.all()) != 0 {
				t.Errorf("answer text %q, emitted %q; want no text", answer.Text, d.all())
			}
			var name, args string
			switch raw := answer.Raw.(type) {
			case *openai.ChatCompletion:
				if calls := raw.Choices[0].Message.ToolCalls; len(calls) == 1 {
					name, args = calls[0].Function.Name, calls[0].Function.Arguments
				}
			case *responses.Response:
				if out := raw.Output; len(out) == 1 && out[0].Type == "function_call" {
					name, args = out[0].Name, out[0].Arguments.OfString
				}
			}
			if name != "get_weather" || args != weatherArgs {
				t.Errorf("Raw %T calls %q with %q, want get_weather with %q", answer.Raw, name, args, weatherArgs)
			}
		})
	}
}

// sseTransport answers every request with a Responses stream of events,
// gap apart, in the test's own time: under synctest, the gaps pass in
// virtual time. The stream ends early, with the request's context's
// error, when that context ends.
type sseTransport struct {
	events []string
	gap    time.Duration
}

func (tr sseTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	pr, pw := io.Pipe()
	go func() {
		for i, ev := range tr.events {
			if i > 0 {
				t := time.NewTimer(tr.gap)
				select {
				case <-t.C:
				case <-req.Context().Done():
					t.Stop()
					pw.CloseWithError(req.Context().Err())
					return
				}
			}
			if _, err := io.WriteString(pw, ev); err != nil {
				return // the client closed the body
			}
		}
		pw.Close()
	}()
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"text/event-stream"}},
		Body:       pr,
		Request:    req,
	}, nil
}

// toolCallEvents is a Responses stream that calls a tool, with no text
// at all: response.created, n argument deltas and response.completed.
func toolCallEvents(n int) []string {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	events := []string{ev("response.created", `{"type":"response.created","sequence_number":0,"response":`+
		`{"id":"resp_1","object":"response","created_at":0,"model":"gpt-a","status":"in_progress","output":[]}}`)}
	for i := range n {
		events = append(events, ev("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":`+
			strconv.Itoa(i+1)+`,"item_id":"fc_1","output_index":0,"delta":"`+strconv.Itoa(i)+`"}`))
	}
	events = append(events, ev("response.completed", `{"type":"response.completed","sequence_number":`+strconv.Itoa(n+1)+`,"response":`+
		`{"id":"resp_1","object":"response","created_at":0,"model":"gpt-a","status":"completed",`+
		`"output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}","status":"completed"}],`+
		`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":`+strconv.Itoa(n)+
		`,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`+strconv.Itoa(10+n)+`}}}`))
	return events
}

// In virtual time: a Responses stream of tool-call events a second apart,
// eleven seconds in all, outlives a StallTimeout of 1.5s, with an emit or
// without, while one whose events come 2s apart is cut at the first gap.
func TestResponsesStreamEveryEventIsProgress(t *testing.T) {
	t.Parallel()
	const stall = 1500 * time.Millisecond
	tests := []struct {
		name    string
		gap     time.Duration
		stalled bool
	}{
		{name: "busy", gap: time.Second},
		{name: "silent", gap: 2 * time.Second, stalled: true},
	}
	for _, tc := range tests {
		for _, emit := range []bool{true, false} {
			t.Run(tc.name+"/emit_"+strconv.FormatBool(emit), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					client := openai.NewClient(
						option.WithBaseURL("http://provider.invalid/v1/"),
						option.WithAPIKey(testKey),
						option.WithHTTPClient(&http.Client{Transport: sseTransport{events: toolCallEvents(10), gap: tc.gap}}),
					)
					var d deltas
					a := openairetry.ResponsesStream(client, "gpt-a", buildResponses, d.emit)
					if !emit {
						a = openairetry.ResponsesStream(client, "gpt-a", buildResponses, nil)
					}
					a.StallTimeout = stall
					var attempts []llmretry.Attempt
					chain := &llmretry.Chain[string, llmretry.Completion]{
						Backends:  []llmretry.Backend[string, llmretry.Completion]{a},
						OnAttempt: func(_ context.Context, a llmretry.Attempt) { attempts = append(attempts, a) },
					}
					start := time.Now()
					_, err := chain.Do(t.Context(), "weather?")
					took := time.Since(start)
					if len(attempts) != 1 {
						t.Fatalf("Do() = %v after %d attempts, want one", err, len(attempts))
					}
					switch {
					case tc.stalled && attempts[0].Kind != llmretry.KindTimeout:
						t.Errorf("Do() = %v, record kind %v; want the stall cut it", err, attempts[0].Kind)
					case tc.stalled && took != stall:
						t.Errorf("stalled stream cut after %v, want %v", took, stall)
					case !tc.stalled && err != nil:
						t.Errorf("Do() error = %v after %v, want the tool call (10 events %v apart)", err, took, tc.gap)
					case !tc.stalled && took != 11*tc.gap:
						t.Errorf("Do() answered after %v, want %v (12 events)", took, 11*tc.gap)
					}
				})
			})
		}
	}
}
