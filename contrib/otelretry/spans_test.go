package otelretry_test

import (
	"context"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// with merges maps into a new one, later keys over earlier.
func with(ms ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// The attributes that say what a span of each test backend was asked.
var (
	gpt4o = map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o"}
	mini  = map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini"}
)

// answer are the attributes of an answer "Paris." by llmretrytest from
// model, its n-th request for that model.
func answer(model string, n int) map[string]any {
	return map[string]any{
		"gen_ai.response.model": model, "gen_ai.response.finish_reasons": []string{"stop"},
		"gen_ai.response.id": "chatcmpl-" + model + "-" + string(rune('0'+n)),
	}
}

// usage are the attributes of the answer's usage: 10 input tokens, one
// output token a word.
var usage = map[string]any{"gen_ai.usage.input_tokens": int64(10), "gen_ai.usage.output_tokens": int64(1)}

// try are the attributes of try number try of backend bi.
func try(bi, try int) map[string]any {
	m := map[string]any{"llmretry.backend": int64(bi), "llmretry.try": int64(try), "llmretry.delivered": false}
	if try > 1 {
		m["http.request.resend_count"] = int64(try - 1)
	}
	return m
}

// httpSpan is the otelhttp client span of a request answered with status
// (0: none came).
func httpSpan(status int64) node {
	n := node{Name: "HTTP POST", Kind: "client"}
	switch {
	case status == 0:
		n.Status = "Error"
	case status >= 400:
		n.Status = "Error"
		n.Attrs = map[string]any{"http.response.status_code": status}
	default:
		n.Attrs = map[string]any{"http.response.status_code": status}
	}
	return n
}

// TestSpanTree checks the span tree of each way a call can go, with the
// real openai-go client over otelhttp, so that the HTTP spans' parents
// are what the SDK made of the attempt's context: a client span named
// "{operation} {model}" per call, charged to the backend that answered;
// an inference span, client too, per request sent, with the usage; an
// internal span per skip.
func TestSpanTree(t *testing.T) {
	waits := llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	tests := []struct {
		name     string
		scripts  map[string][]llmretrytest.Step
		backends func(r *rig) []backend
		// before, when set, prepares the call and returns its context.
		before  func(t *testing.T, r *rig, ctx context.Context) context.Context
		want    func(srv map[string]any) node
		wantErr string // the call's error.type; "" for an answer
	}{
		{
			name:     "success",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o")} },
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o", Kind: "client", Attrs: with(gpt4o, answer("gpt-4o", 1), srv), Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Attrs: with(gpt4o, try(0, 1), answer("gpt-4o", 1), usage, srv),
						Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			name:    "retried",
			scripts: map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Status(503), llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Retry = waits
				return []backend{b}
			},
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o", Kind: "client", Attrs: with(gpt4o, answer("gpt-4o", 2), srv), Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + status503, Attrs: with(gpt4o, try(0, 1), srv, map[string]any{
						"llmretry.kind": "transient", "llmretry.next": "retry", "llmretry.retry_in": 0.001,
						"http.response.status_code": int64(503), "error.type": "transient",
					}), Events: []string{"llmretry.retry llmretry.retry_in=0.001", "exception exception.type=*llmretry.Failure"},
						Children: []node{httpSpan(503)}},
					{Name: "chat gpt-4o", Kind: "client", Attrs: with(gpt4o, try(0, 2), answer("gpt-4o", 2), usage, srv),
						Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			name: "fail_over",
			scripts: map[string][]llmretrytest.Step{
				"gpt-4o":      {llmretrytest.Status(500)},
				"gpt-4o-mini": {llmretrytest.Answer("Paris.")},
			},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o"), r.chat("gpt-4o-mini")} },
			// The call is named and charged for the backend that answered.
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, answer("gpt-4o-mini", 1), srv), Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + status500, Attrs: with(gpt4o, try(0, 1), srv, map[string]any{
						"llmretry.kind": "transient", "llmretry.next": "fail_over", "llmretry.why": "waits_used",
						"http.response.status_code": int64(500), "error.type": "transient",
					}), Events: []string{"exception exception.type=*llmretry.Failure"}, Children: []node{httpSpan(500)}},
					{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, try(1, 1), answer("gpt-4o-mini", 1), usage, srv),
						Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			name: "skipped",
			scripts: map[string][]llmretrytest.Step{
				"gpt-4o":      {llmretrytest.Status(500)},
				"gpt-4o-mini": {llmretrytest.Answer("Paris.")},
			},
			backends: func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: time.Hour}
				return []backend{b, r.chat("gpt-4o-mini")}
			},
			before: func(t *testing.T, r *rig, ctx context.Context) context.Context {
				// A first call's 500 opens the breaker; only the second's
				// spans are compared.
				if _, err := r.instrument(&chain{Backends: r.backends}).Do(ctx, "warm up"); err != nil {
					t.Fatalf("first Do() = %v, want nil", err)
				}
				r.spans.Reset()
				return ctx
			},
			// A skip sent nothing: it is no inference, and no GenAI
			// operation.
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, answer("gpt-4o-mini", 2), srv), Children: []node{
					{Name: "skip gpt-4o", Kind: "internal", Attrs: map[string]any{
						"gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o",
						"llmretry.backend": int64(0), "llmretry.try": int64(1),
						"llmretry.kind": "transient", "llmretry.next": "fail_over", "llmretry.why": "breaker",
						"llmretry.skipped": true, "llmretry.retry_after": 3600.0,
					}},
					{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, try(1, 1), answer("gpt-4o-mini", 2), usage, srv),
						Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			// A pool's deployment is named on each request's span, with
			// why it was chosen, and on the call's: east's 503 sends the
			// request on to west at once, and west, served by Azure,
			// answers.
			name:     "pool",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Status(503), llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend { return []backend{r.pool()} },
			want: func(srv map[string]any) node {
				azure := with(gpt4o, map[string]any{"gen_ai.provider.name": "azure.ai.openai"})
				return node{Name: "chat gpt-4o", Kind: "client", Attrs: with(azure, answer("gpt-4o", 2), srv, map[string]any{
					"llmretry.deployment": "west",
				}), Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + status503, Attrs: with(gpt4o, try(0, 1), srv, map[string]any{
						"llmretry.deployment": "east", "llmretry.deployment.chosen": "order",
						"llmretry.kind": "transient", "llmretry.next": "retry", "llmretry.retry_in": 0.0,
						"http.response.status_code": int64(503), "error.type": "transient",
					}), Events: []string{"llmretry.retry llmretry.retry_in=0", "exception exception.type=*llmretry.Failure"},
						Children: []node{httpSpan(503)}},
					{Name: "chat gpt-4o", Kind: "client", Attrs: with(azure, try(0, 2), answer("gpt-4o", 2), usage, srv, map[string]any{
						"llmretry.deployment": "west", "llmretry.deployment.chosen": "only",
					}), Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			// A pool none of whose deployments can take the request is
			// skipped, and its skip names the deployment whose breaker
			// half-opens first, chosen as the soonest.
			name: "pool_skipped",
			scripts: map[string][]llmretrytest.Step{
				"gpt-4o":      {llmretrytest.Status(500)},
				"gpt-4o-mini": {llmretrytest.Answer("Paris.")},
			},
			backends: func(r *rig) []backend {
				p := r.pool()
				for i := range p.Pool {
					p.Pool[i].Backend.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: time.Hour}
				}
				return []backend{p, r.chat("gpt-4o-mini")}
			},
			before: func(t *testing.T, r *rig, ctx context.Context) context.Context {
				// A first call's 500s, east's then west's, open both
				// breakers; only the second call's spans are compared.
				if _, err := r.instrument(&chain{Backends: r.backends}).Do(ctx, "warm up"); err != nil {
					t.Fatalf("first Do() = %v, want nil", err)
				}
				r.spans.Reset()
				return ctx
			},
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, answer("gpt-4o-mini", 2), srv), Children: []node{
					{Name: "skip gpt-4o", Kind: "internal", Attrs: map[string]any{
						"gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o",
						"llmretry.backend": int64(0), "llmretry.try": int64(1),
						"llmretry.deployment": "east", "llmretry.deployment.chosen": "soonest",
						"llmretry.kind": "transient", "llmretry.next": "fail_over", "llmretry.why": "breaker",
						"llmretry.skipped": true, "llmretry.retry_after": 3600.0,
					}},
					{Name: "chat gpt-4o-mini", Kind: "client", Attrs: with(mini, try(1, 1), answer("gpt-4o-mini", 2), usage, srv),
						Children: []node{httpSpan(200)}},
				}}
			},
		},
		{
			name:     "truncated",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Truncated("Paris is")}},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o")} },
			// The truncation's message is its kind: the description says
			// more than error.type does.
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + truncatedLine, Attrs: with(gpt4o, map[string]any{
					"error.type": "truncated",
				}), Events: []string{"exception exception.type=*llmretry.Truncated"}, Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: [backend 0 gpt-4o try 1] truncated (stopping: not_retryable)",
						Attrs: with(gpt4o, try(0, 1), srv, map[string]any{
							"llmretry.kind": "truncated", "llmretry.next": "stop", "llmretry.why": "not_retryable",
							"error.type": "truncated", "gen_ai.usage.input_tokens": int64(10), "gen_ai.usage.output_tokens": int64(2),
						}), Events: []string{"exception exception.type=*llmretry.Failure"}, Children: []node{httpSpan(200)}},
				}}
			},
			wantErr: "truncated",
		},
		{
			name:    "timed_out",
			scripts: map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.StallHeaders()}},
			backends: func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Timeout = 50 * time.Millisecond
				return []backend{b}
			},
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + timedOutLine, Attrs: with(gpt4o, map[string]any{
					"error.type": "timed_out",
				}), Events: []string{"exception exception.type=*llmretry.TimedOut"}, Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + timeoutLine, Attrs: with(gpt4o, try(0, 1), srv, map[string]any{
						"llmretry.kind": "timeout", "llmretry.next": "stop", "llmretry.why": "waits_used",
						"error.type": "timeout",
					}), Events: []string{"exception exception.type=context.deadlineExceededError"}, Children: []node{httpSpan(0)}},
				}}
			},
			wantErr: "timed_out",
		},
		{
			name:     "cancelled",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o")} },
			before: func(t *testing.T, r *rig, ctx context.Context) context.Context {
				ctx, cancel := context.WithCancel(ctx)
				t.Cleanup(cancel)
				r.beforeSend = cancel // the caller withdraws as the request goes out
				return ctx
			},
			// The call ended in an error: error.type says which, and the
			// status is Error, with the error's message.
			want: func(srv map[string]any) node {
				return node{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + cancelledLine, Attrs: with(gpt4o, map[string]any{
					"error.type": "cancelled",
				}), Events: []string{"exception exception.type=*llmretry.Cancelled"}, Children: []node{
					{Name: "chat gpt-4o", Kind: "client", Status: "Error: context canceled", Attrs: with(gpt4o, try(0, 1), map[string]any{
						"llmretry.kind": "cancelled", "llmretry.next": "stop", "llmretry.why": "cancelled",
						"error.type": "cancelled",
					}), Events: []string{"exception exception.type=*errors.errorString"}, Children: []node{httpSpan(0)}},
				}}
			},
			wantErr: "cancelled",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			for model, steps := range tc.scripts {
				r.srv.Script(model, steps...)
			}
			r.backends = tc.backends(r)
			ctx := context.Background()
			if tc.before != nil {
				ctx = tc.before(t, r, ctx)
			}
			_, err := r.instrument(&chain{Backends: r.backends}).Do(ctx, "What is the capital of France?")
			if (err != nil) != (tc.wantErr != "") {
				t.Fatalf("Do() = %v, want an error: %v", err, tc.wantErr != "")
			}
			if diff := cmp.Diff([]node{tc.want(r.server(t))}, r.tree(t), roughRetryAfter); diff != "" {
				t.Errorf("span tree (-want +got):\n%s", diff)
			}
		})
	}
}

// roughRetryAfter compares llmretry.retry_after within a second: a skip's
// is the time left until its breaker half-opens, read from the clock.
var roughRetryAfter = cmp.FilterPath(func(p cmp.Path) bool {
	mi, ok := p.Last().(cmp.MapIndex)
	return ok && mi.Key().String() == "llmretry.retry_after"
}, cmp.Comparer(func(a, b any) bool {
	x, ok1 := a.(float64)
	y, ok2 := b.(float64)
	return ok1 && ok2 && math.Abs(x-y) < 1
}))

// The first lines of the errors of the cases above.
const (
	status503     = "http 503: OpenAI API error: 503 Service Unavailable"
	status500     = "http 500: OpenAI API error: 500 Internal Server Error"
	truncatedLine = "llmretry: truncated after 1 attempt on 1 backend: raise the completion budget (max tokens)"
	timedOutLine  = "llmretry: timed out after 1 attempt on 1 backend: raise the backends' Timeout or StallTimeout"
	cancelledLine = "llmretry: cancelled after 1 attempt: context canceled"
	timeoutLine   = "context deadline exceeded"
)

// TestNestedSpanTree checks that an instrumented chain run by a backend
// of another hangs its call span under the outer attempt's span, and its
// HTTP span under its own attempt's.
func TestNestedSpanTree(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
	inner := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o")}})
	outer := r.instrument(&chain{Backends: []backend{{Model: "router", Call: inner.Do}}})
	if _, err := outer.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	names := func(n node) []string {
		var out []string
		var walk func(n node, depth int)
		walk = func(n node, depth int) {
			out = append(out, strings.Repeat("  ", depth)+n.Name)
			for _, c := range n.Children {
				walk(c, depth+1)
			}
		}
		walk(n, 0)
		return out
	}
	var got []string
	for _, root := range r.tree(t) {
		got = append(got, names(root)...)
	}
	want := []string{"chat router", "  chat router", "    chat gpt-4o", "      chat gpt-4o", "        HTTP POST"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("span tree (-want +got):\n%s", diff)
	}
}
