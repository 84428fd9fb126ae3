package otelretry

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
)

// Our own attribute keys. The rest are the conventions' (semconv).
const (
	keyBackend    = attribute.Key("llmretry.backend")     // the backend's 0-based place in the chain
	keyTry        = attribute.Key("llmretry.try")         // Attempt.Try
	keyKind       = attribute.Key("llmretry.kind")        // Attempt.Kind's name, for a failure
	keyNext       = attribute.Key("llmretry.next")        // Attempt.Next
	keyWhy        = attribute.Key("llmretry.why")         // Attempt.Why
	keyRetryIn    = attribute.Key("llmretry.retry_in")    // Attempt.RetryIn, in seconds, when Next is retry
	keyRetryAfter = attribute.Key("llmretry.retry_after") // the server's hint, in seconds, when it gave one
	keyDelivered  = attribute.Key("llmretry.delivered")   // Attempt.Delivered
	keySkipped    = attribute.Key("llmretry.skipped")     // Attempt.Skipped, only when true
	keyFailed     = attribute.Key("llmretry.failed")      // on token usage: the attempt failed, yet was billed
	keyRawText    = attribute.Key("llmretry.raw_text")    // a failed attempt's output, only with RecordContent
)

// The explicit bucket boundaries the conventions advise for the GenAI
// client histograms: the default ones are milliseconds-shaped and would
// put every LLM call in the last bucket.
var (
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// telemetry is one instrumented chain's tracer, instruments and
// settings. It is shared by every call of the chain and only read.
type telemetry struct {
	tracer   trace.Tracer
	op       string
	content  bool
	backends []backendInfo

	duration metric.Float64Histogram
	tokens   metric.Int64Histogram
	attempts metric.Int64Counter
}

// newTelemetry makes the tracer and instruments cfg asks for, and
// registers the backends' Breakers for observation.
func newTelemetry(cfg Config, backends []backendInfo) *telemetry {
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(scope), op: cfg.Operation, content: cfg.RecordContent, backends: backends}
	if t.op == "" {
		t.op = "chat"
	}
	for i := range t.backends {
		b := &t.backends[i]
		if cfg.Provider != nil {
			b.provider = cfg.Provider(i, b.model)
		} else {
			b.provider = GuessProvider(b.model)
		}
	}

	meter := mp.Meter(scope)
	var err error
	t.duration, err = meter.Float64Histogram("gen_ai.client.operation.duration",
		metric.WithDescription("GenAI operation duration."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	handle(err)
	t.tokens, err = meter.Int64Histogram("gen_ai.client.token.usage",
		metric.WithDescription("Number of input and output tokens used."), metric.WithUnit("{token}"),
		metric.WithExplicitBucketBoundaries(tokenBuckets...))
	handle(err)
	t.attempts, err = meter.Int64Counter("llmretry.attempts",
		metric.WithDescription("Attempts of chain calls, skips included, by what followed them."), metric.WithUnit("{attempt}"))
	handle(err)
	t.observeBreakers(meter)
	return t
}

// first is the chain's first backend, which names the call; a chain
// without backends (a configuration error) has an unknown one.
func (t *telemetry) first() backendInfo {
	if len(t.backends) == 0 {
		return backendInfo{model: "unknown"}
	}
	return t.backends[0]
}

// backend is backend i, or an unknown one for an index the chain does not
// have (a record a caller's own hook made up).
func (t *telemetry) backend(i int) backendInfo {
	if i < 0 || i >= len(t.backends) {
		return backendInfo{index: i, model: "unknown"}
	}
	return t.backends[i]
}

// modelAttrs are the attributes that name backend b.
func (t *telemetry) modelAttrs(b backendInfo) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.GenAIOperationNameKey.String(t.op), semconv.GenAIRequestModel(b.model)}
	if b.provider != "" {
		attrs = append(attrs, semconv.GenAIProviderNameKey.String(b.provider))
	}
	return attrs
}

// callStart starts the span of one Do and returns the context the call
// runs under, which carries the span and the call's state.
func (t *telemetry) callStart(ctx context.Context) (context.Context, *call, time.Time) {
	began := time.Now()
	first := t.first()
	ctx, span := t.tracer.Start(ctx, t.op+" "+first.model,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(t.modelAttrs(first)...))
	c := &call{span: span}
	return context.WithValue(ctx, callKey{t}, c), c, began
}

// callEnd ends call c, which Do (begun at began) ended with resp and err,
// and records its duration.
func (t *telemetry) callEnd(ctx context.Context, c *call, began time.Time, resp any, err error) {
	if c.attempt != nil {
		// Not reached while the chain keeps OnAttemptStart's promise.
		c.attempt.End()
		c.attempt = nil
	}
	measure := t.modelAttrs(t.first())
	if err != nil {
		et := outcome(err)
		c.span.SetAttributes(semconv.ErrorTypeKey.String(et))
		if et != "cancelled" {
			// The caller's own withdrawal is its intent, not a failure of
			// the call.
			c.span.SetStatus(codes.Error, firstLine(llmretry.Redact(err.Error())))
		}
		measure = append(measure, semconv.ErrorTypeKey.String(et))
	} else if a := c.answer; a != nil {
		comp, isComp := completionOf(resp)
		model := a.Model
		if isComp && comp.Model != "" {
			model = comp.Model // the provider's own name, with its version
		}
		attrs := []attribute.KeyValue{semconv.GenAIResponseModel(model)}
		u := a.Usage
		if u == nil && isComp && (comp.InputTokens != 0 || comp.OutputTokens != 0) {
			u = &llmretry.Usage{InputTokens: comp.InputTokens, OutputTokens: comp.OutputTokens}
		}
		if u != nil {
			attrs = append(attrs, usageAttrs(*u)...)
		}
		if isComp && comp.StopReason != "" {
			attrs = append(attrs, semconv.GenAIResponseFinishReasons(comp.StopReason))
		}
		if t.content && isComp {
			attrs = append(attrs, semconv.GenAIOutputMessagesKey.String(outputMessages(comp)))
		}
		c.span.SetAttributes(attrs...)
		measure = append(measure, semconv.GenAIResponseModel(model))
		if u != nil {
			t.recordTokens(ctx, t.backend(a.Backend), *u, semconv.GenAIResponseModel(model))
		}
	}
	t.duration.Record(ctx, time.Since(began).Seconds(), metric.WithAttributes(measure...))
	c.span.End()
}

// attemptStart starts the span of try number try of backend bi, under the
// call's span, and returns the context the backend's Call runs under.
func (t *telemetry) attemptStart(ctx context.Context, bi, try int) context.Context {
	c := t.callOf(ctx)
	if c == nil {
		return ctx // the chain was copied with our hooks but not our WrapDo
	}
	b := t.backend(bi)
	attrs := append(t.modelAttrs(b), keyBackend.Int(bi), keyTry.Int(try))
	if try > 1 {
		// The conventions leave it out of a first request. Try counts the
		// requests sent to the backend in this call, so it is the resends.
		attrs = append(attrs, semconv.HTTPRequestResendCount(try-1))
	}
	ctx, c.attempt = t.tracer.Start(ctx, "attempt "+b.model,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return ctx
}

// attemptEnd ends the span of attempt a, or, for a skip, makes one that
// covers it, and counts the attempt.
func (t *telemetry) attemptEnd(ctx context.Context, a llmretry.Attempt) {
	b := t.backend(a.Backend)
	end := a.Start.Add(a.Elapsed)
	c := t.callOf(ctx)
	var span trace.Span
	switch {
	case c != nil && c.attempt != nil && !a.Skipped:
		span, c.attempt = c.attempt, nil
	default:
		// A skip sent nothing, so nothing started a span: it gets a short
		// one, from its record's times.
		_, span = t.tracer.Start(ctx, "attempt "+b.model, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithTimestamp(a.Start), trace.WithAttributes(append(t.modelAttrs(b), keyBackend.Int(a.Backend), keyTry.Int(a.Try))...))
	}
	answered := a.Err == nil && a.Next == "" && !a.Skipped
	if answered && c != nil {
		c.answer = &a
	}

	attrs := []attribute.KeyValue{keyDelivered.Bool(a.Delivered)}
	counted := t.modelAttrs(b)
	if !answered {
		outcome := []attribute.KeyValue{keyKind.String(a.Kind.String()), keyNext.String(string(a.Next))}
		if a.Why != "" {
			outcome = append(outcome, keyWhy.String(string(a.Why)))
		}
		if a.Skipped {
			outcome = append(outcome, keySkipped.Bool(true))
		}
		attrs = append(attrs, outcome...)
		counted = append(counted, outcome...)
		if !a.Skipped {
			attrs = append(attrs, semconv.ErrorTypeKey.String(a.Kind.String()))
		}
	}
	if a.Next == llmretry.NextRetry {
		attrs = append(attrs, keyRetryIn.Float64(a.RetryIn.Seconds()))
	}
	if a.RetryAfter != 0 {
		attrs = append(attrs, keyRetryAfter.Float64(a.RetryAfter.Seconds()))
	}
	if a.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(a.Status))
	}
	if a.Usage != nil {
		attrs = append(attrs, usageAttrs(*a.Usage)...)
	}
	if t.content && a.RawText != nil && !answered {
		attrs = append(attrs, keyRawText.String(*a.RawText))
	}
	span.SetAttributes(attrs...)
	if a.Next == llmretry.NextRetry {
		// The wait is the gap before the next attempt's span; the event
		// says how long it was meant to be, and from when.
		span.AddEvent("llmretry.retry", trace.WithTimestamp(end),
			trace.WithAttributes(keyRetryIn.Float64(a.RetryIn.Seconds())))
	}
	if !answered && !a.Skipped && a.Kind != llmretry.KindCancelled {
		desc := a.Kind.String()
		if a.Err != nil {
			desc = firstLine(llmretry.Redact(a.Err.Error()))
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End(trace.WithTimestamp(end))

	t.attempts.Add(ctx, 1, metric.WithAttributes(counted...))
	if a.Usage != nil && !answered {
		// A failed attempt's tokens were billed all the same; the answer's
		// are recorded when Do returns, with the model that answered.
		t.recordTokens(ctx, b, *a.Usage, keyFailed.Bool(true))
	}
}

// recordTokens records usage u of backend b as gen_ai.client.token.usage,
// one point per token type, with extra attributes.
func (t *telemetry) recordTokens(ctx context.Context, b backendInfo, u llmretry.Usage, extra ...attribute.KeyValue) {
	attrs := append(t.modelAttrs(b), extra...)
	for _, p := range [...]struct {
		kind attribute.KeyValue
		n    int64
	}{{semconv.GenAITokenTypeInput, u.InputTokens}, {semconv.GenAITokenTypeOutput, u.OutputTokens}} {
		t.tokens.Record(ctx, p.n, metric.WithAttributes(append(attrs, p.kind)...))
	}
}

// usageAttrs are the conventions' attributes of usage u; the cached and
// reasoning counts only when the provider gave them.
func usageAttrs(u llmretry.Usage) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.GenAIUsageInputTokens(int(u.InputTokens)), semconv.GenAIUsageOutputTokens(int(u.OutputTokens))}
	if u.CachedInputTokens != 0 {
		attrs = append(attrs, semconv.GenAIUsageCacheReadInputTokens(int(u.CachedInputTokens)))
	}
	if u.ReasoningTokens != 0 {
		attrs = append(attrs, semconv.GenAIUsageReasoningOutputTokens(int(u.ReasoningTokens)))
	}
	return attrs
}

// completionOf returns resp as an [llmretry.Completion], when it is one
// (or a non-nil pointer to one).
func completionOf(resp any) (llmretry.Completion, bool) {
	switch r := resp.(type) {
	case llmretry.Completion:
		return r, true
	case *llmretry.Completion:
		if r != nil {
			return *r, true
		}
	}
	return llmretry.Completion{}, false
}

// outputMessages is the answer as the conventions' output messages JSON:
// one assistant message with one text part.
func outputMessages(comp llmretry.Completion) string {
	type part struct {
		Type    string `json:"type"`
		Content string `json:"content"`
	}
	type message struct {
		Role         string `json:"role"`
		Parts        []part `json:"parts"`
		FinishReason string `json:"finish_reason,omitempty"`
	}
	b, _ := json.Marshal([]message{{Role: "assistant", Parts: []part{{"text", comp.Text}}, FinishReason: comp.StopReason}}) // strings always encode
	return string(b)
}

// firstLine is s up to its first newline: a span's status is one line,
// and an Exhausted's message lists every attempt on the lines after.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Breaker states as llmretry.breaker.state reports them.
const (
	stateClosed   = 0
	stateOpen     = 1
	stateHalfOpen = 2
)

// observeBreakers registers the state and openings of each backend's
// Breaker with meter, read when the meter collects.
func (t *telemetry) observeBreakers(meter metric.Meter) {
	var watched []backendInfo
	for _, b := range t.backends {
		if b.breaker != nil {
			watched = append(watched, b)
		}
	}
	if len(watched) == 0 {
		return
	}
	state, err := meter.Int64ObservableGauge("llmretry.breaker.state",
		metric.WithDescription("State of a backend's Breaker: 0 closed, 1 open, 2 half-open."), metric.WithUnit("1"))
	handle(err)
	openings, err := meter.Int64ObservableCounter("llmretry.breaker.openings",
		metric.WithDescription("Times a backend's Breaker opened."), metric.WithUnit("{opening}"))
	handle(err)
	// A counter must never go down, but a Breaker with a Store reads its
	// count from the fleet, which can be lower than the count it kept on
	// its own while the store was down: report the highest seen. With a
	// Store every process reports the fleet's count, so a dashboard takes
	// the max across processes, not the sum.
	var mu sync.Mutex
	seen := make([]int64, len(watched))
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for i, b := range watched {
			st := b.breaker.State()
			attrs := metric.WithAttributes(append(t.modelAttrs(b), keyBackend.Int(b.index))...)
			o.ObserveInt64(state, breakerState(st, now), attrs)
			seen[i] = max(seen[i], int64(st.Opened))
			o.ObserveInt64(openings, seen[i], attrs)
		}
		return nil
	}, state, openings)
	handle(err)
}

// breakerState is st's state at now: half-open once the open period is
// over (the next call probes) or while a probe is in flight.
func breakerState(st llmretry.BreakerState, now time.Time) int64 {
	switch {
	case !st.Open:
		return stateClosed
	case st.Probing || !st.Until.After(now):
		return stateHalfOpen
	}
	return stateOpen
}
