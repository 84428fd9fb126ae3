package otelretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The chains under test send a prompt and answer with a Completion.
type (
	chain   = llmretry.Chain[string, llmretry.Completion]
	backend = llmretry.Backend[string, llmretry.Completion]
)

// scope is the instrumentation scope of otelretry's spans and metrics.
const scope = "github.com/llmretry/llmretry/contrib/otelretry"

// rig is one test's provider, HTTP client and telemetry pipeline: a
// scripted server, the real openai-go client over otelhttp, an in-memory
// span exporter and a manual metric reader.
type rig struct {
	srv    *llmretrytest.Server
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	client openai.Client

	// beforeSend, when set, runs in the transport beneath otelhttp just
	// before a request goes out: the HTTP span has started by then.
	beforeSend func()
	// refuse, when set, may fail a call of a chat backend before it
	// sends anything.
	refuse func() error
	// backends are the test chain's backends, once a test built them.
	backends []backend
}

// newRig starts a rig whose client talks to the server at baseURL, or at
// the server's own OpenAI URL when baseURL is "".
func newRig(t *testing.T, baseURL func(srv *llmretrytest.Server) string) *rig {
	t.Helper()
	r := &rig{srv: llmretrytest.NewServer(), spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	t.Cleanup(r.srv.Close)
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	r.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	url := r.srv.OpenAIBaseURL()
	if baseURL != nil {
		url = baseURL(r.srv)
	}
	transport := otelhttp.NewTransport(roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if r.beforeSend != nil {
			r.beforeSend()
		}
		return http.DefaultTransport.RoundTrip(req)
	}), otelhttp.WithTracerProvider(r.tp), otelhttp.WithMeterProvider(r.mp))
	r.client = openai.NewClient(option.WithBaseURL(url), option.WithAPIKey("sk-test"),
		option.WithHTTPClient(&http.Client{Transport: transport}), option.WithMaxRetries(0))
	return r
}

// roundTripFunc is a function as an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// instrument instruments c with the rig's providers.
func (r *rig) instrument(c *chain) *chain {
	return otelretry.Instrument(c, otelretry.Config{TracerProvider: r.tp, MeterProvider: r.mp})
}

// chat is a backend that sends the prompt to model through the rig's
// client: built on openai-go directly, as a contrib module may not
// require another one. It reports usage as the adapters do.
func (r *rig) chat(model string) backend {
	return backend{
		Model: model,
		Call: func(ctx context.Context, prompt string) (llmretry.Completion, error) {
			if r.refuse != nil {
				if err := r.refuse(); err != nil {
					return llmretry.Completion{}, err
				}
			}
			cc, err := r.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
			})
			if apiErr, ok := errors.AsType[*openai.Error](err); ok {
				var h http.Header
				if apiErr.Response != nil {
					h = apiErr.Response.Header
				}
				return llmretry.Completion{}, llmretry.StatusFailure(apiErr.StatusCode, h, err)
			}
			if err != nil {
				return llmretry.Completion{}, err
			}
			u := llmretry.Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens}
			choice := cc.Choices[0]
			if choice.FinishReason == "length" {
				f := llmretry.Truncation(choice.Message.Content)
				f.Usage = &u
				return llmretry.Completion{}, f
			}
			llmretry.ReportUsage(ctx, u)
			return llmretry.Completion{
				ID: cc.ID, Model: cc.Model, Text: choice.Message.Content, StopReason: choice.FinishReason,
				InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, Raw: cc,
			}, nil
		},
	}
}

// pool is a backend of model gpt-4o that is a pool of two deployments
// of it through the rig's client, each with a Breaker: east, served by
// OpenAI, and west, by Azure OpenAI.
func (r *rig) pool() backend {
	east, west := r.chat("gpt-4o"), r.chat("gpt-4o")
	east.Provider, west.Provider = "openai", "azure.ai.openai"
	east.Breaker, west.Breaker = &llmretry.Breaker{}, &llmretry.Breaker{}
	return backend{Model: "gpt-4o", Pool: []llmretry.Deployment[string, llmretry.Completion]{
		{Name: "east", Backend: east}, {Name: "west", Backend: west},
	}}
}

// node is a span as the tests compare it: its children in start order.
// HTTP spans keep only their status code, the rest of their attributes
// being otelhttp's business.
type node struct {
	Name     string
	Kind     string
	Status   string // "Error: description", or "" when unset
	Attrs    map[string]any
	Events   []string // name and attributes
	Children []node
}

// tree returns the rig's exported spans as trees, the roots in start
// order.
func (r *rig) tree(t *testing.T) []node {
	t.Helper()
	stubs := r.spans.GetSpans()
	children := map[trace.SpanID][]int{}
	var roots []int
	ids := map[trace.SpanID]bool{}
	for _, s := range stubs {
		ids[s.SpanContext.SpanID()] = true
	}
	for i, s := range stubs {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			children[p] = append(children[p], i)
		} else {
			roots = append(roots, i)
		}
	}
	var build func(i int) node
	byStart := func(idx []int) []int {
		slices.SortStableFunc(idx, func(a, b int) int { return stubs[a].StartTime.Compare(stubs[b].StartTime) })
		return idx
	}
	build = func(i int) node {
		s := stubs[i]
		n := node{Name: s.Name, Kind: s.SpanKind.String()}
		if s.Status.Code == codes.Error {
			n.Status = "Error: " + s.Status.Description
		}
		http := s.InstrumentationScope.Name != scope
		for _, kv := range s.Attributes {
			if http && kv.Key != "http.response.status_code" {
				continue
			}
			if n.Attrs == nil {
				n.Attrs = map[string]any{}
			}
			n.Attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		if http {
			n.Status = ""
			if s.Status.Code == codes.Error {
				n.Status = "Error"
			}
		}
		for _, e := range s.Events {
			attrs := e.Attributes
			if e.Name == "exception" {
				// Its message is the error's whole text, which names the
				// server's URL: the trees keep its type, and
				// TestExceptionEvent checks messages.
				attrs = slices.DeleteFunc(slices.Clone(attrs), func(kv attribute.KeyValue) bool { return kv.Key == "exception.message" })
			}
			set := attribute.NewSet(attrs...)
			n.Events = append(n.Events, e.Name+" "+set.Encoded(attribute.DefaultEncoder()))
		}
		for _, c := range byStart(children[s.SpanContext.SpanID()]) {
			n.Children = append(n.Children, build(c))
		}
		return n
	}
	var out []node
	for _, i := range byStart(roots) {
		out = append(out, build(i))
	}
	return out
}

// server is the server.address and server.port of the rig's server, as
// its spans carry them.
func (r *rig) server(t *testing.T) map[string]any {
	t.Helper()
	u, err := url.Parse(r.srv.URL)
	if err != nil {
		t.Fatalf("url.Parse(%q) = %v", r.srv.URL, err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("port of %q: %v", r.srv.URL, err)
	}
	return map[string]any{"server.address": u.Hostname(), "server.port": int64(port)}
}

// collect reads the rig's metrics.
func (r *rig) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect() = %v, want nil", err)
	}
	return rm
}
