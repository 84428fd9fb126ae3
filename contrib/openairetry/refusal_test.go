package openairetry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// A refusal for the content ends the chain in every mode: it is not
// retried, and the next backend, whose filter may be weaker, is not
// asked. The record keeps the text written before the filter stopped it,
// and what the refused answer cost.
func TestRefusalStopsChain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		step  llmretrytest.Step
		want  row // gpt-a's record, Model and Try set by the test
		usage *llmretry.Usage
		msg   string // in the record's error, for chat and responses
	}{
		{
			// finish_reason content_filter; the Responses API's
			// incomplete response with reason content_filter.
			name: "filtered_answer", step: llmretrytest.Refuse("I will not"),
			want:  row{Step: "refused", Kind: llmretry.KindRefused, Raw: text("I will not"), Next: llmretry.NextStop, Why: llmretry.WhyRefused},
			usage: &llmretry.Usage{InputTokens: 10, OutputTokens: 3},
			msg:   "content filter stopped the",
		},
		{
			// Azure OpenAI's 400 for a prompt its filter blocked.
			name: "filtered_prompt", step: llmretrytest.ContentFilter(),
			want: row{Step: "status 400 content_filter", Kind: llmretry.KindRefused, Status: 400, Next: llmretry.NextStop, Why: llmretry.WhyRefused},
			msg:  "code content_filter, request req_gpt-a_1",
		},
	}
	for _, m := range modes {
		for _, tc := range tests {
			t.Run(m.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", tc.step, llmretrytest.Answer("ok"))
				srv.Script("gpt-b", llmretrytest.Answer("ok"))
				client := newClient(srv)
				a := backend(m, client, "gpt-a", &deltas{})
				a.Retry = waits(3)

				_, attempts, err := run(t, a, backend(m, client, "gpt-b", &deltas{}))
				want := tc.want
				want.Model, want.Try = "gpt-a", 1
				// A stream hands over its text before it learns of the
				// filter.
				want.Delivered = m.streams() && want.Raw != nil
				if want.Delivered {
					want.Why = llmretry.WhyDelivered
				}
				if diff := cmp.Diff([]row{want}, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if _, ok := errors.AsType[*llmretry.Exhausted](err); !ok {
					t.Errorf("Do() error = %T %v, want an *llmretry.Exhausted", err, err)
				}
				if llmretry.RetryItem(err) {
					t.Errorf("RetryItem(%v) = true, want false: the same content is refused again", err)
				}
				if len(attempts) > 0 {
					if diff := cmp.Diff(tc.usage, attempts[0].Usage); diff != "" {
						t.Errorf("record's usage (-want +got):\n%s", diff)
					}
					if msg := fmt.Sprint(attempts[0].Err); !strings.Contains(msg, tc.msg) {
						t.Errorf("record's error = %q, want it to contain %q", msg, tc.msg)
					}
				}
			})
		}
	}
}

// With FailOverRefused, a refused prompt goes to the next backend.
func TestRefusalFailsOverWhenAsked(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.Script("gpt-a", llmretrytest.ContentFilter())
			srv.Script("gpt-b", llmretrytest.Answer("ok"))
			client := newClient(srv)
			var attempts []llmretry.Attempt
			chain := &llmretry.Chain[string, llmretry.Completion]{
				Backends:        []llmretry.Backend[string, llmretry.Completion]{backend(m, client, "gpt-a", &deltas{}), backend(m, client, "gpt-b", &deltas{})},
				FailOverRefused: true,
				OnAttempt:       func(_ context.Context, a llmretry.Attempt) { attempts = append(attempts, a) },
			}
			answer, err := chain.Do(t.Context(), "hi")
			if err != nil || answer.Text != "ok" {
				t.Fatalf("Do() = %q, %v; want gpt-b's answer", answer.Text, err)
			}
			want := []row{
				{Model: "gpt-a", Try: 1, Step: "status 400 content_filter", Kind: llmretry.KindRefused, Status: 400,
					Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
				answered(m, "gpt-b", 1),
			}
			if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

// A response the Responses API reports as failed is judged by its error
// code: a server error is retried, a rate limit too, a policy refuses the
// content, and any other code rejects the input. The Chat endpoint has no
// failed answers and sends the same code as an error event, or as the
// HTTP error it stands for, which maps the same way.
func TestFailedResponse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code   string
		kind   llmretry.Kind
		status int
		next   llmretry.Next
		why    llmretry.Why
	}{
		{"server_error", llmretry.KindTransient, 500, llmretry.NextRetry, ""},
		{"rate_limit_exceeded", llmretry.KindTransient, 429, llmretry.NextRetry, ""},
		{"invalid_prompt", llmretry.KindRejected, 0, llmretry.NextFailOver, llmretry.WhyNotRetryable},
		{"bio_policy", llmretry.KindRefused, 0, llmretry.NextStop, llmretry.WhyRefused},
	}
	for _, m := range []mode{respPlain, respStream} {
		for _, tc := range tests {
			t.Run(m.String()+"/"+tc.code, func(t *testing.T) {
				t.Parallel()
				srv := newServer(t)
				srv.Script("gpt-a", llmretrytest.Failed(tc.code), llmretrytest.Answer("ok"))
				srv.Script("gpt-b", llmretrytest.Answer("ok"))
				client := newClient(srv)
				a := backend(m, client, "gpt-a", &deltas{})
				a.Retry = waits(1)

				_, attempts, _ := run(t, a, backend(m, client, "gpt-b", &deltas{}))
				want := []row{{Model: "gpt-a", Try: 1, Step: "failed " + tc.code, Kind: tc.kind, Status: tc.status, Next: tc.next, Why: tc.why}}
				switch tc.next {
				case llmretry.NextRetry:
					want[0].RetryIn = short
					want = append(want, answered(m, "gpt-a", 2))
				case llmretry.NextFailOver:
					want = append(want, answered(m, "gpt-b", 1))
				}
				if diff := cmp.Diff(want, joinLog(t, m, attempts, srv)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if len(attempts) > 0 {
					if msg, want := fmt.Sprint(attempts[0].Err), "response failed (code "+tc.code; !strings.Contains(msg, want) {
						t.Errorf("record's error = %q, want it to contain %q", msg, want)
					}
				}
			})
		}
	}
}
