package otelretry_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// TestNothingSecretExported plants an API key in the client's URL and a
// marker in the prompt, plays a retried call, and searches every span
// and metric exported, otelhttp's included, for either.
func TestNothingSecretExported(t *testing.T) {
	const (
		key    = "sk-planted0123456789abcdefSECRET"
		marker = "PROMPT-MARKER-7f3a9c"
	)
	r := newRig(t, func(srv *llmretrytest.Server) string {
		return strings.Replace(srv.OpenAIBaseURL(), "http://", "http://user:"+key+"@", 1)
	})
	r.srv.Script("gpt-4o", llmretrytest.Status(500), llmretrytest.Answer("Paris."))
	// The first call fails as a client that quotes the URL it was given
	// fails, credentials and all: the attempt's error holds the key.
	var refused atomic.Bool
	r.refuse = func() error {
		if refused.Swap(true) {
			return nil
		}
		return &url.Error{Op: "Post", URL: r.srv.URL + "/v1/chat/completions?api-key=" + key, Err: syscall.ECONNRESET}
	}
	b := r.chat("gpt-4o")
	b.Retry = llmretry.Policy{Waits: []time.Duration{time.Millisecond, time.Millisecond}}
	c := r.instrument(&chain{Backends: []backend{b}})
	if _, err := c.Do(context.Background(), "Say "+marker+" back"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}

	var exported strings.Builder
	spans := r.spans.GetSpans()
	if len(spans) != 6 {
		t.Fatalf("exported %d spans, want 6: a call, three attempts, two requests sent", len(spans))
	}
	for _, s := range spans {
		fmt.Fprintln(&exported, s.Name, s.Status.Description, s.Resource.Encoded(attribute.DefaultEncoder()))
		set := attribute.NewSet(s.Attributes...)
		fmt.Fprintln(&exported, set.Encoded(attribute.DefaultEncoder()))
		for _, e := range s.Events {
			set := attribute.NewSet(e.Attributes...)
			fmt.Fprintln(&exported, e.Name, set.Encoded(attribute.DefaultEncoder()))
		}
		for _, l := range s.Links {
			set := attribute.NewSet(l.Attributes...)
			fmt.Fprintln(&exported, set.Encoded(attribute.DefaultEncoder()))
		}
	}
	ps := points(r.collect(t), "")
	if len(ps) == 0 {
		t.Fatal("no metrics exported")
	}
	for _, p := range ps {
		fmt.Fprintln(&exported, p.Metric, p.Attrs)
	}
	text := exported.String()
	// The URL itself was exported, so the search had something to find.
	if !strings.Contains(text, "/v1/chat/completions") {
		t.Fatalf("no span has the request's URL; exported:\n%s", text)
	}
	for _, secret := range []string{key, marker} {
		if strings.Contains(text, secret) {
			t.Errorf("exported telemetry holds %q:\n%s", secret, text)
		}
	}
}

// TestRecordContent checks the opt-in: the answer's text, as the
// conventions' output messages with their finish reason, on the call's
// span and the inference span of the attempt that answered, and a
// truncated attempt's text on its span; none of it without the opt-in.
func TestRecordContent(t *testing.T) {
	for _, record := range []bool{false, true} {
		t.Run(fmt.Sprint(record), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			r.srv.Script("gpt-4o", llmretrytest.Truncated("Paris is"))
			r.srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris."))
			c := otelretry.Instrument(&chain{Backends: []backend{r.chat("gpt-4o"), r.chat("gpt-4o-mini")}},
				otelretry.Config{TracerProvider: r.tp, MeterProvider: r.mp, RecordContent: record})
			if _, err := c.Do(context.Background(), "q"); err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			var got []string
			for _, s := range r.spans.GetSpans() {
				for _, kv := range s.Attributes {
					if kv.Key == "gen_ai.output.messages" || kv.Key == "llmretry.raw_text" {
						got = append(got, s.Name+" "+string(kv.Key)+" "+kv.Value.AsString())
					}
				}
			}
			slices.Sort(got)
			var want []string
			if record {
				const answer = `[{"role":"assistant","parts":[{"type":"text","content":"Paris."}],"finish_reason":"stop"}]`
				want = []string{
					"chat gpt-4o llmretry.raw_text Paris is",
					"chat gpt-4o-mini gen_ai.output.messages " + answer, // the call's
					"chat gpt-4o-mini gen_ai.output.messages " + answer, // the answering attempt's
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("content attributes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOutputMessagesFinishReason checks that an output message always
// has its finish reason, which the conventions' schema requires: the
// answer's own, or "stop" for an answer that gave none, since the chain
// took it as whole.
func TestOutputMessagesFinishReason(t *testing.T) {
	r := newRig(t, nil) // its server is not asked
	for _, reason := range []string{"end_turn", ""} {
		c := otelretry.Instrument(&chain{Backends: []backend{{Model: "m-" + reason, Call: func(context.Context, string) (llmretry.Completion, error) {
			return llmretry.Completion{Text: "Paris.", StopReason: reason}, nil
		}}}}, otelretry.Config{TracerProvider: r.tp, MeterProvider: r.mp, RecordContent: true})
		if _, err := c.Do(context.Background(), "q"); err != nil {
			t.Fatalf("Do() = %v, want nil", err)
		}
	}
	var got []string
	for _, s := range r.spans.GetSpans() {
		for _, kv := range s.Attributes {
			if kv.Key == "gen_ai.output.messages" {
				got = append(got, s.Name+" "+kv.Value.AsString())
			}
		}
	}
	slices.Sort(got)
	const text = `[{"role":"assistant","parts":[{"type":"text","content":"Paris."}],"finish_reason":`
	want := []string{
		"chat m- " + text + `"stop"}]`, "chat m- " + text + `"stop"}]`,
		"chat m-end_turn " + text + `"end_turn"}]`, "chat m-end_turn " + text + `"end_turn"}]`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("output messages (-want +got):\n%s", diff)
	}
}
