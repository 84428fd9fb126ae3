package otelretry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
)

// ExampleInstrument wires a chain whose primary fails once and is then
// answered, and prints its spans: the call, and an inference span for
// each request sent, with what followed it. The usage is the answering
// request's, on its span only: the call's does not count it again.
func ExampleInstrument() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))

	tries := 0
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{{
			Model:    "gpt-4o",
			Provider: "openai", // as openairetry's backends say
			Retry:    llmretry.Policy{Waits: []time.Duration{time.Millisecond}},
			Call: func(ctx context.Context, prompt string) (llmretry.Completion, error) {
				if tries++; tries == 1 {
					return llmretry.Completion{}, llmretry.StatusFailure(503, nil, errors.New("overloaded"))
				}
				llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 12, OutputTokens: 3})
				return llmretry.Completion{Model: "gpt-4o-2024-08-06", Text: "Paris.", StopReason: "stop"}, nil
			},
		}},
	}
	chain = otelretry.Instrument(chain, otelretry.Config{TracerProvider: tp})
	if _, err := chain.Do(context.Background(), "What is the capital of France?"); err != nil {
		fmt.Println(err)
		return
	}

	// Ended spans come children first; print the call, then its attempts.
	got := spans.GetSpans()
	slices.SortStableFunc(got, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for _, s := range got {
		var attrs []string
		for _, kv := range s.Attributes {
			switch kv.Key {
			case "llmretry.try", "llmretry.next", "llmretry.retry_in", "http.request.resend_count",
				"gen_ai.response.model", "gen_ai.usage.output_tokens":
				attrs = append(attrs, string(kv.Key)+"="+kv.Value.String())
			}
		}
		slices.Sort(attrs)
		indent := "  "
		if !s.Parent.IsValid() {
			indent = ""
		}
		fmt.Printf("%s%s (%s): %s\n", indent, s.Name, s.SpanKind, strings.Join(attrs, " "))
	}
	// Output:
	// chat gpt-4o (client): gen_ai.response.model=gpt-4o-2024-08-06
	//   chat gpt-4o (client): llmretry.next=retry llmretry.retry_in=0.001 llmretry.try=1
	//   chat gpt-4o (client): gen_ai.response.model=gpt-4o-2024-08-06 gen_ai.usage.output_tokens=3 http.request.resend_count=1 llmretry.try=2
}
