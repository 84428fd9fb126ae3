// Command otel shows the OpenTelemetry trace of a llmretry.Chain getting
// an answer through a scripted outage, over real HTTP on loopback.
//
// Two scripted OpenAI-compatible servers (llmretrytest, on 127.0.0.1)
// play the outage: gpt-4o's answers 503, then 429 with a retry-after,
// then goes down; gpt-4o-mini's answers. The chain, instrumented with
// otelretry.Instrument, retries gpt-4o twice, fails over and is answered.
// The HTTP client is plain net/http wrapped by otelhttp, so each HTTP
// span hangs under the inference span of the request that sent it. The program prints the span
// tree, each span with its start and length from the call's start and its
// attributes.
//
//	go run .
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "otel:", err)
		os.Exit(1)
	}
}

// run plays the outage and writes the trace to w.
func run(w io.Writer) error {
	primary, secondary := llmretrytest.NewServer(), llmretrytest.NewServer()
	defer primary.Close()
	defer secondary.Close()
	primary.Script("gpt-4o",
		llmretrytest.Status(503),
		llmretrytest.Status(429).WithHeader("retry-after-ms", "30"),
		llmretrytest.Down(),
	)
	secondary.Script("gpt-4o-mini", llmretrytest.Answer("Paris is the capital of France."))

	// Spans go to memory, to be printed as a tree once the call is done;
	// a real program would give the providers its exporter instead.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(tp))}

	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{
			// Provider names who serves the model, as openairetry's
			// backends do; otelretry puts it on the spans.
			{Model: "gpt-4o", Provider: "openai", Call: chat(client, primary.OpenAIBaseURL(), "gpt-4o"),
				Retry: llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}}},
			{Model: "gpt-4o-mini", Provider: "openai", Call: chat(client, secondary.OpenAIBaseURL(), "gpt-4o-mini")},
		},
	}
	chain = otelretry.Instrument(chain, otelretry.Config{TracerProvider: tp})

	answer, err := chain.Do(context.Background(), "What is the capital of France?")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "answer: %s\n\n", answer.Text)
	printTree(w, spans.GetSpans())
	return nil
}

// chat is a backend that sends the prompt to model at the OpenAI-style
// base URL, with plain net/http. It passes its context on to the request:
// that context carries the attempt's span, which otelhttp makes the
// parent of the request's.
func chat(client *http.Client, baseURL, model string) func(context.Context, string) (llmretry.Completion, error) {
	return func(ctx context.Context, prompt string) (llmretry.Completion, error) {
		body, err := json.Marshal(map[string]any{
			"model":    model,
			"messages": []map[string]string{{"role": "user", "content": prompt}},
		})
		if err != nil {
			return llmretry.Completion{}, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"chat/completions", bytes.NewReader(body))
		if err != nil {
			return llmretry.Completion{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return llmretry.Completion{}, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return llmretry.Completion{}, err
		}
		if resp.StatusCode != http.StatusOK {
			return llmretry.Completion{}, llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(strings.TrimSpace(string(data))))
		}
		var cc struct {
			Model   string `json:"model"`
			Choices []struct {
				Message      struct{ Content string } `json:"message"`
				FinishReason string                   `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &cc); err != nil || len(cc.Choices) == 0 {
			return llmretry.Completion{}, llmretry.ParseFailure(string(data), errors.New("no choices"))
		}
		u := llmretry.Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens}
		llmretry.ReportUsage(ctx, u)
		return llmretry.Completion{
			Model: cc.Model, Text: cc.Choices[0].Message.Content, StopReason: cc.Choices[0].FinishReason,
			InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		}, nil
	}
}

// printTree writes spans as an indented tree, children in start order,
// each with its start and length in milliseconds from the first root's
// start, its attributes and its events.
func printTree(w io.Writer, spans tracetest.SpanStubs) {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if s.Parent.IsValid() {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(ss []tracetest.SpanStub) []tracetest.SpanStub {
		slices.SortStableFunc(ss, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		return ss
	}
	roots = byStart(roots)
	if len(roots) == 0 {
		return
	}
	t0 := roots[0].StartTime
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond)) }
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		indent := strings.Repeat("  ", depth)
		fmt.Fprintf(w, "%s%s  [%s +%s, %s]", indent, s.Name, s.SpanKind, ms(s.StartTime.Sub(t0)), ms(s.EndTime.Sub(s.StartTime)))
		if s.Status.Description != "" {
			fmt.Fprintf(w, "  status: %s", s.Status.Description)
		}
		fmt.Fprintln(w)
		if attrs := shown(s.Attributes); attrs != "" {
			fmt.Fprintf(w, "%s    %s\n", indent, attrs)
		}
		for _, e := range s.Events {
			fmt.Fprintf(w, "%s    event %s at +%s: %s\n", indent, e.Name, ms(e.Time.Sub(t0)), shown(e.Attributes))
		}
		for _, c := range byStart(children[s.SpanContext.SpanID()]) {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// shown is attrs as "key=value" pairs, sorted, leaving out those that
// every span of the example repeats, otelhttp's connection details, and
// an exception's message, which the span's status line already gives.
func shown(attrs []attribute.KeyValue) string {
	var out []string
	for _, kv := range attrs {
		switch kv.Key {
		case "gen_ai.operation.name", "gen_ai.provider.name", "server.address", "server.port",
			"network.protocol.version", "http.request.method", "url.full", "exception.message":
			continue
		}
		out = append(out, string(kv.Key)+"="+kv.Value.String())
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
