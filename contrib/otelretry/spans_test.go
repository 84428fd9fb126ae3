package otelretry_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Attributes every span of the test chains' backends carries.
func gpt4o(more map[string]any) map[string]any {
	return with(map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o"}, more)
}

func mini(more map[string]any) map[string]any {
	return with(map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini"}, more)
}

// with adds more to base.
func with(base, more map[string]any) map[string]any {
	for k, v := range more {
		base[k] = v
	}
	return base
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

// answered are the attributes of an attempt, or a call, answered with
// "Paris." by llmretrytest: 10 input tokens, one output token a word.
var answered = map[string]any{"gen_ai.usage.input_tokens": int64(10), "gen_ai.usage.output_tokens": int64(1)}

// TestSpanTree checks the span tree of each way a call can go, with the
// real openai-go client over otelhttp, so that the HTTP spans' parents
// are what the SDK made of the attempt's context.
func TestSpanTree(t *testing.T) {
	waits := llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	tests := []struct {
		name     string
		scripts  map[string][]llmretrytest.Step
		backends func(r *rig) []backend
		// before, when set, prepares the call and returns its context.
		before  func(t *testing.T, r *rig, ctx context.Context) context.Context
		want    node
		wantErr string // the call's error.type; "" for an answer
	}{
		{
			name:     "success",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o")} },
			want: node{Name: "chat gpt-4o", Kind: "client", Attrs: gpt4o(with(map[string]any{
				"gen_ai.response.model": "gpt-4o", "gen_ai.response.finish_reasons": []string{"stop"},
			}, answered)), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Attrs: gpt4o(with(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
				}, answered)), Children: []node{httpSpan(200)}},
			}},
		},
		{
			name:    "retried",
			scripts: map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Status(503), llmretrytest.Answer("Paris.")}},
			backends: func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Retry = waits
				return []backend{b}
			},
			want: node{Name: "chat gpt-4o", Kind: "client", Attrs: gpt4o(with(map[string]any{
				"gen_ai.response.model": "gpt-4o", "gen_ai.response.finish_reasons": []string{"stop"},
			}, answered)), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Status: "Error: " + status503, Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "transient", "llmretry.next": "retry", "llmretry.retry_in": 0.001,
					"http.response.status_code": int64(503), "error.type": "transient",
				}), Events: []string{"llmretry.retry llmretry.retry_in=0.001"}, Children: []node{httpSpan(503)}},
				{Name: "attempt gpt-4o", Kind: "internal", Attrs: gpt4o(with(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(2), "llmretry.delivered": false,
					"http.request.resend_count": int64(1),
				}, answered)), Children: []node{httpSpan(200)}},
			}},
		},
		{
			name: "fail_over",
			scripts: map[string][]llmretrytest.Step{
				"gpt-4o":      {llmretrytest.Status(500)},
				"gpt-4o-mini": {llmretrytest.Answer("Paris.")},
			},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o"), r.chat("gpt-4o-mini")} },
			want: node{Name: "chat gpt-4o", Kind: "client", Attrs: gpt4o(with(map[string]any{
				"gen_ai.response.model": "gpt-4o-mini", "gen_ai.response.finish_reasons": []string{"stop"},
			}, answered)), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Status: "Error: " + status500, Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "transient", "llmretry.next": "fail_over", "llmretry.why": "waits_used",
					"http.response.status_code": int64(500), "error.type": "transient",
				}), Children: []node{httpSpan(500)}},
				{Name: "attempt gpt-4o-mini", Kind: "internal", Attrs: mini(with(map[string]any{
					"llmretry.backend": int64(1), "llmretry.try": int64(1), "llmretry.delivered": false,
				}, answered)), Children: []node{httpSpan(200)}},
			}},
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
			want: node{Name: "chat gpt-4o", Kind: "client", Attrs: gpt4o(with(map[string]any{
				"gen_ai.response.model": "gpt-4o-mini", "gen_ai.response.finish_reasons": []string{"stop"},
			}, answered)), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "transient", "llmretry.next": "fail_over", "llmretry.why": "breaker",
					"llmretry.skipped": true, "llmretry.retry_after": 3600.0,
				})},
				{Name: "attempt gpt-4o-mini", Kind: "internal", Attrs: mini(with(map[string]any{
					"llmretry.backend": int64(1), "llmretry.try": int64(1), "llmretry.delivered": false,
				}, answered)), Children: []node{httpSpan(200)}},
			}},
		},
		{
			name:     "truncated",
			scripts:  map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Truncated("Paris is")}},
			backends: func(r *rig) []backend { return []backend{r.chat("gpt-4o")} },
			want: node{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + truncatedLine, Attrs: gpt4o(map[string]any{
				"error.type": "truncated",
			}), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Status: "Error: truncated", Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "truncated", "llmretry.next": "stop", "llmretry.why": "not_retryable",
					"error.type": "truncated", "gen_ai.usage.input_tokens": int64(10), "gen_ai.usage.output_tokens": int64(2),
				}), Children: []node{httpSpan(200)}},
			}},
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
			want: node{Name: "chat gpt-4o", Kind: "client", Status: "Error: " + timedOutLine, Attrs: gpt4o(map[string]any{
				"error.type": "timed_out",
			}), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Status: "Error: " + timeoutLine, Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "timeout", "llmretry.next": "stop", "llmretry.why": "waits_used",
					"error.type": "timeout",
				}), Children: []node{httpSpan(0)}},
			}},
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
			// Cancelled is the caller's intent: error.type says so, the
			// status does not call it a failure.
			want: node{Name: "chat gpt-4o", Kind: "client", Attrs: gpt4o(map[string]any{
				"error.type": "cancelled",
			}), Children: []node{
				{Name: "attempt gpt-4o", Kind: "internal", Attrs: gpt4o(map[string]any{
					"llmretry.backend": int64(0), "llmretry.try": int64(1), "llmretry.delivered": false,
					"llmretry.kind": "cancelled", "llmretry.next": "stop", "llmretry.why": "cancelled",
					"error.type": "cancelled",
				}), Children: []node{httpSpan(0)}},
			}},
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
			if diff := cmp.Diff([]node{tc.want}, r.tree(t), roughRetryAfter); diff != "" {
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
	want := []string{"chat router", "  attempt router", "    chat gpt-4o", "      attempt gpt-4o", "        HTTP POST"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("span tree (-want +got):\n%s", diff)
	}
}
