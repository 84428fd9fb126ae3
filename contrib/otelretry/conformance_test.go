package otelretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// These tests check the telemetry against the OpenTelemetry GenAI
// semantic conventions (v1.41.0) as properties of every span and metric
// point, where TestSpanTree and TestMetrics check whole cases.

// attrs returns a span's attributes by key.
func attrs(s tracetest.SpanStub) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// ours returns the spans of otelretry's scope.
func ours(spans tracetest.SpanStubs) tracetest.SpanStubs {
	return slices.DeleteFunc(slices.Clone(spans), func(s tracetest.SpanStub) bool { return s.InstrumentationScope.Name != scope })
}

// playAll runs one call of each way a call can go, each with its own
// rig, and returns the rigs.
func playAll(t *testing.T) []*rig {
	t.Helper()
	waits := llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
	cases := []struct {
		scripts  map[string][]llmretrytest.Step
		backends func(r *rig) []backend
	}{
		{map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Answer("Paris.")}},
			func(r *rig) []backend { return []backend{r.chat("gpt-4o")} }},
		{map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Status(503), llmretrytest.Answer("Paris.")}},
			func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Retry = waits
				return []backend{b}
			}},
		{map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Status(500)}, "llama-3": {llmretrytest.Truncated("Paris is")}, "gpt-4o-mini": {llmretrytest.Answer("Paris.")}},
			func(r *rig) []backend { return []backend{r.chat("gpt-4o"), r.chat("llama-3"), r.chat("gpt-4o-mini")} }},
		{map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.StallHeaders()}},
			func(r *rig) []backend {
				b := r.chat("gpt-4o")
				b.Timeout = 20 * time.Millisecond
				return []backend{b}
			}},
		{map[string][]llmretrytest.Step{"gpt-4o": {llmretrytest.Truncated("Paris is")}},
			func(r *rig) []backend { return []backend{r.chat("gpt-4o")} }},
	}
	var rigs []*rig
	for _, tc := range cases {
		r := newRig(t, nil)
		for model, steps := range tc.scripts {
			r.srv.Script(model, steps...)
		}
		r.instrument(&chain{Backends: tc.backends(r)}).Do(context.Background(), "q")
		rigs = append(rigs, r)
	}
	// A breaker's skip, and a cancel.
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(500))
	r.srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris."))
	b := r.chat("gpt-4o")
	b.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: time.Hour}
	c := r.instrument(&chain{Backends: []backend{b, r.chat("gpt-4o-mini")}})
	c.Do(context.Background(), "q")
	c.Do(context.Background(), "q")
	rigs = append(rigs, r)
	r = newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.beforeSend = cancel
	r.instrument(&chain{Backends: []backend{r.chat("gpt-4o")}}).Do(ctx, "q")
	return append(rigs, r)
}

// TestInferenceSpanNames checks that every GenAI span, the calls' and the
// requests', is a client span named "{gen_ai.operation.name}
// {gen_ai.request.model}", and that a skip, which sent nothing, is an
// internal span and no GenAI operation.
func TestInferenceSpanNames(t *testing.T) {
	var genAI, skips int
	for _, r := range playAll(t) {
		for _, s := range ours(r.spans.GetSpans()) {
			a := attrs(s)
			if a["llmretry.skipped"].AsBool() {
				skips++
				if _, op := a["gen_ai.operation.name"]; s.SpanKind != trace.SpanKindInternal || op {
					t.Errorf("skip span %q: kind %v, operation %q; want internal, none", s.Name, s.SpanKind, a["gen_ai.operation.name"].AsString())
				}
				continue
			}
			genAI++
			want := a["gen_ai.operation.name"].AsString() + " " + a["gen_ai.request.model"].AsString()
			if s.Name != want || s.SpanKind != trace.SpanKindClient {
				t.Errorf("span %q (%v), want %q (client)", s.Name, s.SpanKind, want)
			}
		}
	}
	if genAI < 15 || skips != 1 {
		t.Errorf("checked %d GenAI spans and %d skips, want at least 15 and 1", genAI, skips)
	}
}

// TestRequiredAttributes checks the conventions' required and
// conditionally required attributes on every GenAI span: the operation
// and the provider always (the provider "_OTHER" when nothing names it),
// the model requested, error.type on a failure, and server.port with
// server.address.
func TestRequiredAttributes(t *testing.T) {
	var failed int
	for _, r := range playAll(t) {
		for _, s := range ours(r.spans.GetSpans()) {
			a := attrs(s)
			if a["llmretry.skipped"].AsBool() {
				continue
			}
			for _, k := range []string{"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"} {
				if a[k].AsString() == "" {
					t.Errorf("span %q has no %s: %v", s.Name, k, s.Attributes)
				}
			}
			if a["gen_ai.request.model"].AsString() == "llama-3" && a["gen_ai.provider.name"].AsString() != "_OTHER" {
				t.Errorf("span %q: gen_ai.provider.name = %q, want _OTHER", s.Name, a["gen_ai.provider.name"].AsString())
			}
			if s.Status.Code == codes.Error {
				failed++
				if a["error.type"].AsString() == "" {
					t.Errorf("failed span %q has no error.type", s.Name)
				}
			}
			_, address := a["server.address"]
			if _, port := a["server.port"]; address != port {
				t.Errorf("span %q: server.address %v with server.port %v", s.Name, a["server.address"], a["server.port"])
			}
		}
	}
	if failed < 8 {
		t.Errorf("checked %d failed spans, want at least 8", failed)
	}
}

// TestStatuses checks that every span whose operation ended in an error
// (a call that failed or was cancelled, a request that failed) has status
// Error, whose description is the error's message, not its error.type,
// and an exception event; and that no other span has either.
func TestStatuses(t *testing.T) {
	var checked int
	for _, r := range playAll(t) {
		for _, s := range ours(r.spans.GetSpans()) {
			a := attrs(s)
			et := a["error.type"].AsString()
			var exceptions int
			for _, e := range s.Events {
				if e.Name == "exception" {
					exceptions++
				}
			}
			switch {
			case a["llmretry.skipped"].AsBool():
				if s.Status.Code != codes.Unset || exceptions != 0 {
					t.Errorf("skip %q: status %v, %d exceptions; want unset, none", s.Name, s.Status, exceptions)
				}
			case et == "":
				if s.Status.Code != codes.Unset || exceptions != 0 {
					t.Errorf("span %q without error.type: status %v, %d exceptions; want unset, none", s.Name, s.Status, exceptions)
				}
			default:
				checked++
				if s.Status.Code != codes.Error || s.Status.Description == "" || s.Status.Description == et || exceptions != 1 {
					t.Errorf("span %q with error.type %q: status %v, %d exceptions; want Error with the message, one exception",
						s.Name, et, s.Status, exceptions)
				}
			}
		}
	}
	if checked < 8 {
		t.Errorf("checked %d failed spans, want at least 8", checked)
	}
}

// TestExceptionEvent checks the exception event of a failed request: the
// error's type, and its message redacted, as is the status description.
func TestExceptionEvent(t *testing.T) {
	const key = "sk-planted0123456789abcdefSECRET"
	// Not a Failure, whose message redacts itself: a client's own error.
	failure := errors.New("post https://api.example.test/v1?api-key=" + key + ": connection reset by peer")
	c := &chain{Backends: []backend{{Model: "gpt-4o", Call: func(context.Context, string) (llmretry.Completion, error) {
		return llmretry.Completion{}, failure
	}}}}
	r := newRig(t, nil) // its server is not asked
	spans := r.spans
	if _, err := otelretry.Instrument(c, otelretry.Config{TracerProvider: r.tp, MeterProvider: r.mp}).Do(context.Background(), "q"); err == nil {
		t.Fatal("Do() = nil, want an error")
	}
	var got []string
	for _, s := range spans.GetSpans() {
		for _, e := range s.Events {
			set := attribute.NewSet(e.Attributes...)
			typ, _ := set.Value("exception.type")
			msg, _ := set.Value("exception.message")
			got = append(got, s.Name+" "+typ.AsString()+": "+msg.AsString())
		}
		got = append(got, s.Name+" status: "+s.Status.Description)
	}
	slices.Sort(got)
	msg := llmretry.Redact(failure.Error())
	if strings.Contains(msg, key) || !strings.Contains(msg, "connection reset by peer") {
		t.Fatalf("Redact(%q) = %q: the test's key is not one Redact knows", failure.Error(), msg)
	}
	var exhausted *llmretry.Exhausted
	_, err := c.Do(context.Background(), "q")
	if !errors.As(err, &exhausted) {
		t.Fatalf("Do() = %v, want an *Exhausted", err)
	}
	callMsg := llmretry.Redact(err.Error())
	want := []string{
		"chat gpt-4o *llmretry.Exhausted: " + callMsg,
		"chat gpt-4o *errors.errorString: " + msg,
		"chat gpt-4o status: " + msg,
		"chat gpt-4o status: " + strings.SplitN(callMsg, "\n", 2)[0],
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exceptions and statuses (-want +got):\n%s", diff)
	}
}

// TestRequestModel checks that the model requested is the backend's, on
// every span of a fail-over, and that a backend without a Model (an
// adapter given none sends the model its build names) is named by the
// model that answered, never "unknown".
func TestRequestModel(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(500))
	r.srv.Script("gpt-4o-mini", llmretrytest.Status(500), llmretrytest.Answer("Paris."))
	anonFails, anonAnswers := r.chat("gpt-4o-mini"), r.chat("gpt-4o-mini")
	anonFails.Model, anonAnswers.Model = "", "" // their Calls still ask for gpt-4o-mini
	c := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o"), anonFails, anonAnswers}})
	if _, err := c.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	var got []string
	for _, s := range ours(r.spans.GetSpans()) {
		a := attrs(s)
		got = append(got, fmt.Sprintf("%s: request %q response %q", s.Name,
			a["gen_ai.request.model"].AsString(), a["gen_ai.response.model"].AsString()))
	}
	slices.Sort(got)
	want := []string{
		`chat gpt-4o-mini: request "gpt-4o-mini" response "gpt-4o-mini"`, // the call, charged to the backend that answered
		`chat gpt-4o-mini: request "gpt-4o-mini" response "gpt-4o-mini"`, // its request
		`chat gpt-4o: request "gpt-4o" response ""`,
		`chat: request "" response ""`, // the failed request of a backend without a Model
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("models by span (-want +got):\n%s", diff)
	}
}

// TestChargedToAnswer checks that a call one provider answered after
// another failed is named, attributed and measured for the one that
// answered.
func TestChargedToAnswer(t *testing.T) {
	r := newRig(t, nil) // its server is not asked
	spans, tp, mp := r.spans, r.tp, r.mp
	c := otelretry.Instrument(&chain{Backends: []backend{
		{Model: "gpt-4o", Provider: "openai", Call: func(context.Context, string) (llmretry.Completion, error) {
			return llmretry.Completion{}, llmretry.StatusFailure(503, nil, errors.New("overloaded"))
		}},
		{Model: "claude-x", Provider: "anthropic", Call: func(ctx context.Context, _ string) (llmretry.Completion, error) {
			return llmretry.Completion{ID: "msg_1", Model: "claude-x-20250101", Text: "Paris.", StopReason: "end_turn"}, nil
		}},
	}}, otelretry.Config{TracerProvider: tp, MeterProvider: mp})
	if _, err := c.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	var call tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		if !s.Parent.IsValid() {
			call = s
		}
	}
	a := attrs(call)
	got := []string{call.Name, a["gen_ai.provider.name"].AsString(), a["gen_ai.request.model"].AsString(),
		a["gen_ai.response.model"].AsString(), a["gen_ai.response.id"].AsString()}
	if diff := cmp.Diff([]string{"chat claude-x", "anthropic", "claude-x", "claude-x-20250101", "msg_1"}, got); diff != "" {
		t.Errorf("call span's name, provider, models and id (-want +got):\n%s", diff)
	}
	var durations []string
	for _, p := range points(r.collect(t), scope) {
		if p.Metric == "gen_ai.client.operation.duration" {
			durations = append(durations, p.Attrs)
		}
	}
	want := []string{"gen_ai.operation.name=chat,gen_ai.provider.name=anthropic,gen_ai.request.model=claude-x,gen_ai.response.model=claude-x-20250101"}
	if diff := cmp.Diff(want, durations); diff != "" {
		t.Errorf("operation duration points (-want +got):\n%s", diff)
	}
}

// TestUsageCountedOnce checks that the gen_ai.usage.* of every span of a
// trace add up to what was billed, each request's once: on the spans of
// the requests, not again on the call's, nor on the request of an outer
// chain whose Call ran an instrumented inner one; and the token metric
// the same.
func TestUsageCountedOnce(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Truncated("Paris is"))
	r.srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris."))
	var billed llmretry.Usage
	var mu sync.Mutex
	inner := r.instrument(&chain{
		Backends: []backend{r.chat("gpt-4o"), r.chat("gpt-4o-mini")},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			if a.Usage != nil {
				mu.Lock()
				billed = billed.Add(*a.Usage)
				mu.Unlock()
			}
		},
	})
	outer := r.instrument(&chain{Backends: []backend{{Model: "router", Call: inner.Do}}})
	if _, err := outer.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	if billed.InputTokens == 0 || billed.OutputTokens == 0 {
		t.Fatalf("billed %+v: the test needs usage", billed)
	}
	var traced llmretry.Usage
	for _, s := range ours(r.spans.GetSpans()) {
		a := attrs(s)
		traced.InputTokens += a["gen_ai.usage.input_tokens"].AsInt64()
		traced.OutputTokens += a["gen_ai.usage.output_tokens"].AsInt64()
	}
	var measured llmretry.Usage
	for _, p := range points(r.collect(t), scope) {
		switch {
		case p.Metric != "gen_ai.client.token.usage":
		case strings.Contains(p.Attrs, "gen_ai.token.type=input"):
			measured.InputTokens += int64(p.Value)
		case strings.Contains(p.Attrs, "gen_ai.token.type=output"):
			measured.OutputTokens += int64(p.Value)
		}
	}
	if traced != billed || measured != billed {
		t.Errorf("usage in spans %+v, in gen_ai.client.token.usage %+v; want what was billed, %+v", traced, measured, billed)
	}
}

// TestRequestStream checks gen_ai.request.stream: true on the spans of a
// backend that streams, left out for one that does not say so.
func TestRequestStream(t *testing.T) {
	r := newRig(t, nil) // its server is not asked
	spans, tp, mp := r.spans, r.tp, r.mp
	answer := func(context.Context, string) (llmretry.Completion, error) {
		return llmretry.Completion{Text: "Paris."}, nil
	}
	for _, stream := range []bool{true, false} {
		c := otelretry.Instrument(&chain{Backends: []backend{{Model: fmt.Sprint("m-", stream), Stream: stream, Call: answer}}},
			otelretry.Config{TracerProvider: tp, MeterProvider: mp})
		if _, err := c.Do(context.Background(), "q"); err != nil {
			t.Fatalf("Do() = %v, want nil", err)
		}
	}
	var got []string
	for _, s := range spans.GetSpans() {
		v, ok := attrs(s)["gen_ai.request.stream"]
		got = append(got, fmt.Sprintf("%s: %v %v", s.Name, ok, v.AsBool()))
	}
	slices.Sort(got)
	want := []string{"chat m-false: false false", "chat m-false: false false", "chat m-true: true true", "chat m-true: true true"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gen_ai.request.stream by span (-want +got):\n%s", diff)
	}
}

// TestServerBehindProxy checks that server.address names the server a
// request was for, not the proxy it went through, with the scheme's
// default port when the URL gives none.
func TestServerBehindProxy(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
	target, err := url.Parse(r.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	t.Cleanup(proxy.Close)
	proxyURL, _ := url.Parse(proxy.URL)
	r.client = openai.NewClient(option.WithBaseURL("http://llm.example.test/v1/"), option.WithAPIKey("sk-test"),
		option.WithHTTPClient(&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}), option.WithMaxRetries(0))
	if _, err := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o")}}).Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	var got []string
	for _, s := range ours(r.spans.GetSpans()) {
		a := attrs(s)
		got = append(got, fmt.Sprintf("%s:%d", a["server.address"].AsString(), a["server.port"].AsInt64()))
	}
	if diff := cmp.Diff([]string{"llm.example.test:80", "llm.example.test:80"}, got); diff != "" {
		t.Errorf("server of each span (-want +got):\n%s", diff)
	}
}

// TestMetricInstruments checks the two GenAI client metrics by the
// conventions: names, units, kinds, the advised bucket boundaries, and
// the attributes of their points.
func TestMetricInstruments(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(400))
	r.srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris."))
	c := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o-mini")}})
	if _, err := c.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	if _, err := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o")}}).Do(context.Background(), "q"); err == nil {
		t.Fatal("Do() = nil, want an error")
	}
	type instrument struct {
		Unit   string
		Bounds []float64
		Attrs  []string // each point's keys
	}
	got := map[string]instrument{}
	keys := func(s attribute.Set) string {
		var k []string
		for _, kv := range s.ToSlice() {
			k = append(k, string(kv.Key))
		}
		return strings.Join(k, ",")
	}
	for _, sm := range r.collect(t).ScopeMetrics {
		if sm.Scope.Name != scope {
			continue
		}
		for _, m := range sm.Metrics {
			in := instrument{Unit: m.Unit}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					in.Bounds = dp.Bounds
					in.Attrs = append(in.Attrs, keys(dp.Attributes))
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					in.Bounds = dp.Bounds
					in.Attrs = append(in.Attrs, keys(dp.Attributes))
				}
			default:
				continue
			}
			slices.Sort(in.Attrs)
			got[m.Name] = in
		}
	}
	const model = "gen_ai.operation.name,gen_ai.provider.name,gen_ai.request.model"
	want := map[string]instrument{
		"gen_ai.client.operation.duration": {
			Unit:   "s",
			Bounds: []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92},
			Attrs:  []string{"error.type," + model, model + ",gen_ai.response.model,server.address,server.port"},
		},
		"gen_ai.client.token.usage": {
			Unit:   "{token}",
			Bounds: []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864},
			Attrs: []string{
				model + ",gen_ai.response.model,gen_ai.token.type,server.address,server.port",
				model + ",gen_ai.response.model,gen_ai.token.type,server.address,server.port",
			},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GenAI instruments (-want +got):\n%s", diff)
	}
}

// TestConcurrentCalls runs many calls of one instrumented chain at once,
// each failing over, under the race detector in CI, and checks that each
// call's trace holds its own spans and that the counts add up.
func TestConcurrentCalls(t *testing.T) {
	const calls = 40
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(503)) // the last step repeats
	r.srv.Script("gpt-4o-mini", llmretrytest.Answer("Paris."))
	c := r.instrument(&chain{Backends: []backend{r.chat("gpt-4o"), r.chat("gpt-4o-mini")}})
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			if _, err := c.Do(context.Background(), "q"); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Do() = %v, want nil", err)
	}

	byTrace := map[trace.TraceID][]string{}
	for _, s := range ours(r.spans.GetSpans()) {
		role := "request"
		if !s.Parent.IsValid() {
			role = "call"
		}
		byTrace[s.SpanContext.TraceID()] = append(byTrace[s.SpanContext.TraceID()], role+" "+s.Name)
	}
	if len(byTrace) != calls {
		t.Errorf("%d traces, want %d", len(byTrace), calls)
	}
	want := []string{"call chat gpt-4o-mini", "request chat gpt-4o", "request chat gpt-4o-mini"}
	for id, got := range byTrace {
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("trace %v (-want +got):\n%s", id, diff)
		}
	}
	var ops, in int64
	for _, p := range points(r.collect(t), scope) {
		switch {
		case p.Metric == "gen_ai.client.operation.duration":
			ops += int64(p.Count)
		case p.Metric == "gen_ai.client.token.usage" && strings.Contains(p.Attrs, "token.type=input"):
			in += int64(p.Value)
		}
	}
	if ops != calls || in != 10*calls {
		t.Errorf("%d operations and %d input tokens measured, want %d and %d", ops, in, calls, 10*calls)
	}
}
