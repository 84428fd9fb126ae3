package otelretry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptrace"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
)

// Our own attribute keys. The rest are the conventions' (semconv).
const (
	keyBackend    = attribute.Key("llmretry.backend")           // the backend's 0-based place in the chain
	keyTry        = attribute.Key("llmretry.try")               // Attempt.Try
	keyKind       = attribute.Key("llmretry.kind")              // Attempt.Kind's name, for a failure
	keyNext       = attribute.Key("llmretry.next")              // Attempt.Next
	keyWhy        = attribute.Key("llmretry.why")               // Attempt.Why
	keyRetryIn    = attribute.Key("llmretry.retry_in")          // Attempt.RetryIn, in seconds, when Next is retry
	keyRetryAfter = attribute.Key("llmretry.retry_after")       // the server's hint, in seconds, when it gave one
	keyDelivered  = attribute.Key("llmretry.delivered")         // Attempt.Delivered
	keySkipped    = attribute.Key("llmretry.skipped")           // Attempt.Skipped, only when true
	keyFailed     = attribute.Key("llmretry.failed")            // on token usage: the attempt failed, yet was billed
	keyRawText    = attribute.Key("llmretry.raw_text")          // a failed attempt's output, only with RecordContent
	keyDeployment = attribute.Key("llmretry.deployment")        // Attempt.Deployment: the pool's deployment a request went to
	keyChosen     = attribute.Key("llmretry.deployment.chosen") // Attempt.Chosen: why it went there
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
	t := &telemetry{
		tracer: tp.Tracer(scope, trace.WithSchemaURL(semconv.SchemaURL)),
		op:     cfg.Operation, content: cfg.RecordContent, backends: backends,
	}
	if t.op == "" {
		t.op = string(genaiconv.OperationNameChat)
	}

	// The conventions' own instruments give the names, units and
	// descriptions; the buckets are theirs too, but advice is the
	// caller's to give.
	meter := mp.Meter(scope, metric.WithSchemaURL(semconv.SchemaURL))
	duration, err := genaiconv.NewClientOperationDuration(meter, metric.WithExplicitBucketBoundaries(durationBuckets...))
	handle(err)
	t.duration = duration.Inst()
	tokens, err := genaiconv.NewClientTokenUsage(meter, metric.WithExplicitBucketBoundaries(tokenBuckets...))
	handle(err)
	t.tokens = tokens.Inst()
	t.attempts, err = meter.Int64Counter("llmretry.attempts",
		metric.WithDescription("Attempts of chain calls, skips included, by what followed them."), metric.WithUnit("{attempt}"))
	handle(err)
	t.observeBreakers(meter)
	return t
}

// first is the chain's first backend, which names a call until another
// answers it; a chain without backends (a configuration error) has an
// unknown one.
func (t *telemetry) first() backendInfo {
	if len(t.backends) == 0 {
		return backendInfo{model: unknownModel, provider: otherProvider}
	}
	return t.backends[0]
}

// backend is backend i, its model as the chain's records name it now, or
// an unknown one for an index the chain does not have (a record a
// caller's own hook made up).
func (t *telemetry) backend(i int, model string) backendInfo {
	if i < 0 || i >= len(t.backends) {
		model = modelName(model)
		return backendInfo{index: i, model: model, provider: providerOf(nil, i, model, "")}
	}
	b := t.backends[i]
	if model != "" {
		b.model = model
	}
	return b
}

// name is the name the conventions give an inference span of backend b:
// "{operation} {model}", or the operation alone when the model is not
// known.
func (t *telemetry) name(b backendInfo) string {
	if b.model == unknownModel {
		return t.op
	}
	return t.op + " " + b.model
}

// modelAttrs are the attributes that say what b is asked to do: the
// operation, the provider and the model requested. Every span and metric
// point of b carries them.
func (t *telemetry) modelAttrs(b backendInfo) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.GenAIOperationNameKey.String(t.op), semconv.GenAIProviderNameKey.String(b.provider)}
	if b.model != unknownModel {
		attrs = append(attrs, semconv.GenAIRequestModel(b.model))
	}
	return attrs
}

// requestAttrs are the attributes of a request to b: the model's, and
// whether it streams, said only when the backend says so.
func (t *telemetry) requestAttrs(b backendInfo) []attribute.KeyValue {
	attrs := t.modelAttrs(b)
	if b.stream {
		attrs = append(attrs, semconv.GenAIRequestStream(true))
	}
	return attrs
}

// callStart starts the span of one Do and returns the context the call
// runs under, which carries the span and the call's state.
func (t *telemetry) callStart(ctx context.Context) (context.Context, *call, time.Time) {
	if outer, _ := ctx.Value(attemptKey{}).(*attempt); outer != nil {
		// This call runs inside another instrumented chain's attempt:
		// its own attempts' spans carry what it costs, so the outer
		// attempt's must not count it again.
		outer.nested.Store(true)
	}
	began := time.Now()
	first := t.first()
	ctx, span := t.tracer.Start(ctx, t.name(first),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(t.requestAttrs(first)...))
	c := &call{span: span}
	return context.WithValue(ctx, callKey{t}, c), c, began
}

// callEnd ends call c, which Do (begun at began) ended with resp and err,
// with the span of the attempt that answered it, and records its
// duration. The call is charged to the backend that answered it, or to
// the first when none did.
func (t *telemetry) callEnd(ctx context.Context, c *call, began time.Time, resp any, err error) {
	if c.attempt != nil {
		// Not reached while the chain keeps OnAttemptStart's promise.
		c.attempt.span.End()
		c.attempt = nil
	}
	var measure []attribute.KeyValue
	if a := c.answer; a != nil {
		b := a.backend
		comp, isComp := completionOf(resp)
		if b.model == unknownModel && isComp && comp.Model != "" {
			// The backend has no Model (an adapter given none sends the
			// model its build func names), so the model that answered is
			// the best knowledge there is of the model asked for.
			b.model = comp.Model
			a.span.SetName(t.name(b))
			a.span.SetAttributes(semconv.GenAIRequestModel(b.model))
		}
		answer := t.answerAttrs(comp, isComp)
		server := serverAttrs(a)
		u := a.record.Usage
		if u == nil && isComp && (comp.InputTokens != 0 || comp.OutputTokens != 0) {
			u = &llmretry.Usage{InputTokens: comp.InputTokens, OutputTokens: comp.OutputTokens}
		}
		if a.nested.Load() {
			u = nil // the nested chain's spans and points carry it
		}

		a.span.SetAttributes(answer...)
		a.span.SetAttributes(server...)
		if u != nil {
			a.span.SetAttributes(usageAttrs(*u)...)
		}
		a.span.End(trace.WithTimestamp(a.record.Start.Add(a.record.Elapsed)))

		c.span.SetName(t.name(b))
		c.span.SetAttributes(t.modelAttrs(b)...)
		if b.deployment != "" {
			c.span.SetAttributes(keyDeployment.String(b.deployment))
		}
		c.span.SetAttributes(answer...)
		c.span.SetAttributes(server...)
		if b.stream != t.first().stream {
			c.span.SetAttributes(semconv.GenAIRequestStream(b.stream))
		}

		measure = append(t.modelAttrs(b), server...)
		if isComp && comp.Model != "" {
			measure = append(measure, semconv.GenAIResponseModel(comp.Model))
		}
		if u != nil {
			t.recordTokens(ctx, *u, measure...)
		}
	} else {
		measure = t.modelAttrs(t.first())
	}
	if err != nil {
		et := semconv.ErrorTypeKey.String(outcome(err))
		msg := llmretry.Redact(err.Error())
		c.span.SetAttributes(et)
		c.span.SetStatus(codes.Error, firstLine(msg))
		c.span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
			semconv.ExceptionType(fmt.Sprintf("%T", err)), semconv.ExceptionMessage(msg)))
		measure = append(measure, et)
	}
	t.duration.Record(ctx, time.Since(began).Seconds(), metric.WithAttributes(measure...))
	c.span.End()
}

// answerAttrs are the attributes of an answer: the conventions' response
// attributes when it is an [llmretry.Completion], and its text when the
// Config opts in.
func (t *telemetry) answerAttrs(comp llmretry.Completion, isComp bool) []attribute.KeyValue {
	if !isComp {
		return nil
	}
	var attrs []attribute.KeyValue
	if comp.ID != "" {
		attrs = append(attrs, semconv.GenAIResponseID(comp.ID))
	}
	if comp.Model != "" {
		attrs = append(attrs, semconv.GenAIResponseModel(comp.Model)) // the provider's own name, with its version
	}
	if comp.StopReason != "" {
		attrs = append(attrs, semconv.GenAIResponseFinishReasons(comp.StopReason))
	}
	if t.content {
		attrs = append(attrs, semconv.GenAIOutputMessagesKey.String(outputMessages(comp)))
	}
	return attrs
}

// attemptStart starts the inference span of try number try of backend
// bi, whose model the chain names model, under the call's span, and
// returns the context the backend's Call runs under: it carries the span,
// for the Call's HTTP client to hang its own under, and the hooks that
// tell where the request went.
func (t *telemetry) attemptStart(ctx context.Context, bi int, model string, try int) context.Context {
	c := t.callOf(ctx)
	if c == nil {
		return ctx // the chain was copied with our hooks but not our WrapDo
	}
	b := t.backend(bi, model)
	attrs := append(t.requestAttrs(b), keyBackend.Int(bi), keyTry.Int(try))
	if try > 1 {
		// The conventions leave it out of a first request. Try counts the
		// requests sent to the backend in this call, so it is the resends.
		attrs = append(attrs, semconv.HTTPRequestResendCount(try-1))
	}
	ctx, span := t.tracer.Start(ctx, t.name(b), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	a := &attempt{span: span, backend: b}
	c.attempt = a
	ctx = context.WithValue(ctx, attemptKey{}, a)
	return httptrace.WithClientTrace(ctx, a.server.trace())
}

// attemptEnd ends the span of attempt rec, or, for a skip, makes one that
// covers it, and counts the attempt. The span of an answer is left for
// callEnd to end, once the answer's attributes are known.
func (t *telemetry) attemptEnd(ctx context.Context, rec llmretry.Attempt) {
	b := t.backend(rec.Backend, rec.Model)
	if rec.Deployment != "" {
		b = b.deploymentOf(rec.Deployment)
	}
	if rec.Skipped {
		t.skipped(ctx, b, rec)
		return
	}
	c := t.callOf(ctx)
	var a *attempt
	if c != nil && c.attempt != nil {
		a, c.attempt = c.attempt, nil
	} else {
		// No start was seen: the chain was copied with our OnAttempt but
		// not our other hooks. The span comes from the record's times.
		_, span := t.tracer.Start(ctx, t.name(b), trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(rec.Start),
			trace.WithAttributes(append(t.requestAttrs(b), keyBackend.Int(rec.Backend), keyTry.Int(rec.Try))...))
		a = &attempt{span: span, backend: b}
	}
	a.record = rec
	answered := rec.Err == nil && rec.Next == ""

	attrs := []attribute.KeyValue{keyDelivered.Bool(rec.Delivered)}
	counted := t.modelAttrs(b)
	if rec.Deployment != "" {
		// The chain names a pool's deployment only in the record: the
		// span started as the pool's, and says now whose it was, the
		// deployment's provider and streaming included.
		a.backend = b
		attrs = append(attrs, t.requestAttrs(b)...)
		attrs = append(attrs, deploymentAttrs(rec)...)
		counted = append(counted, keyDeployment.String(rec.Deployment))
	}
	if !answered {
		outcome := outcomeAttrs(rec)
		attrs = append(attrs, outcome...)
		attrs = append(attrs, semconv.ErrorTypeKey.String(rec.Kind.String()))
		counted = append(counted, outcome...)
	}
	if rec.Next == llmretry.NextRetry {
		attrs = append(attrs, keyRetryIn.Float64(rec.RetryIn.Seconds()))
	}
	if rec.RetryAfter != 0 {
		attrs = append(attrs, keyRetryAfter.Float64(rec.RetryAfter.Seconds()))
	}
	if rec.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(rec.Status))
	}
	server := serverAttrs(a)
	attrs = append(attrs, server...)
	if t.content && rec.RawText != nil && !answered {
		attrs = append(attrs, keyRawText.String(*rec.RawText))
	}
	a.span.SetAttributes(attrs...)
	t.attempts.Add(ctx, 1, metric.WithAttributes(counted...))
	if answered && c != nil {
		c.answer = a
		return
	}

	end := rec.Start.Add(rec.Elapsed)
	if rec.Next == llmretry.NextRetry {
		// The wait is the gap before the next attempt's span; the event
		// says how long it was meant to be, and from when.
		a.span.AddEvent("llmretry.retry", trace.WithTimestamp(end),
			trace.WithAttributes(keyRetryIn.Float64(rec.RetryIn.Seconds())))
	}
	if !answered {
		desc, exception := failureText(rec)
		a.span.SetStatus(codes.Error, desc)
		if exception != nil {
			a.span.AddEvent(semconv.ExceptionEventName, trace.WithTimestamp(end), trace.WithAttributes(exception...))
		}
	}
	if rec.Usage != nil && !a.nested.Load() {
		a.span.SetAttributes(usageAttrs(*rec.Usage)...)
		// A failed attempt's tokens were billed all the same, and say so;
		// an answer's are recorded when Do returns, with the model that
		// answered, but for the answer of a call we have no state of.
		points := append(t.modelAttrs(b), server...)
		if !answered {
			points = append(points, keyFailed.Bool(true))
		}
		t.recordTokens(ctx, *rec.Usage, points...)
	}
	a.span.End(trace.WithTimestamp(end))
}

// skipped makes the span of skip rec of backend b: an internal one, since
// no request was sent, named "skip {model}", covering the wait for the
// breaker when there was one.
func (t *telemetry) skipped(ctx context.Context, b backendInfo, rec llmretry.Attempt) {
	outcome := outcomeAttrs(rec)
	attrs := []attribute.KeyValue{semconv.GenAIProviderNameKey.String(b.provider)}
	if b.model != unknownModel {
		attrs = append(attrs, semconv.GenAIRequestModel(b.model))
	}
	attrs = append(attrs, keyBackend.Int(rec.Backend), keyTry.Int(rec.Try))
	attrs = append(attrs, deploymentAttrs(rec)...)
	attrs = append(attrs, outcome...)
	if rec.Next == llmretry.NextRetry {
		attrs = append(attrs, keyRetryIn.Float64(rec.RetryIn.Seconds()))
	}
	if rec.RetryAfter != 0 {
		attrs = append(attrs, keyRetryAfter.Float64(rec.RetryAfter.Seconds()))
	}
	_, span := t.tracer.Start(ctx, "skip "+b.model, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(rec.Start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(rec.Start.Add(rec.Elapsed)))
	counted := append(t.modelAttrs(b), outcome...)
	if rec.Deployment != "" {
		counted = append(counted, keyDeployment.String(rec.Deployment))
	}
	t.attempts.Add(ctx, 1, metric.WithAttributes(counted...))
}

// deploymentAttrs are the attributes that say which deployment of a pool
// attempt rec went to, or whose breaker held it back, and why: none for
// a backend that is no pool.
func deploymentAttrs(rec llmretry.Attempt) []attribute.KeyValue {
	if rec.Deployment == "" {
		return nil
	}
	attrs := []attribute.KeyValue{keyDeployment.String(rec.Deployment)}
	if rec.Chosen != "" {
		attrs = append(attrs, keyChosen.String(string(rec.Chosen)))
	}
	return attrs
}

// outcomeAttrs are the attributes that say how failed attempt rec went
// and what followed it.
func outcomeAttrs(rec llmretry.Attempt) []attribute.KeyValue {
	attrs := []attribute.KeyValue{keyKind.String(rec.Kind.String()), keyNext.String(string(rec.Next))}
	if rec.Why != "" {
		attrs = append(attrs, keyWhy.String(string(rec.Why)))
	}
	if rec.Skipped {
		attrs = append(attrs, keySkipped.Bool(true))
	}
	return attrs
}

// failureText is the status description and the exception event's
// attributes of failed attempt rec: its error's message, redacted, the
// description its first line. A message that says no more than the Kind
// (a truncation's is "truncated") would only repeat error.type, so the
// description is then the record's own line, which says where it ran and
// what followed. An attempt without an error has no exception.
func failureText(rec llmretry.Attempt) (string, []attribute.KeyValue) {
	if rec.Err == nil {
		return rec.String(), nil
	}
	msg := llmretry.Redact(rec.Err.Error())
	desc := firstLine(msg)
	if desc == rec.Kind.String() {
		desc = rec.String()
	}
	return desc, []attribute.KeyValue{semconv.ExceptionType(fmt.Sprintf("%T", rec.Err)), semconv.ExceptionMessage(msg)}
}

// serverAttrs are the server.address and server.port of attempt a's
// request, when its HTTP client told.
func serverAttrs(a *attempt) []attribute.KeyValue {
	host, port := a.server.addr()
	if host == "" {
		return nil
	}
	attrs := []attribute.KeyValue{semconv.ServerAddress(host)}
	if port != 0 {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	return attrs
}

// recordTokens records usage u as gen_ai.client.token.usage, one point
// per token type, with attrs.
func (t *telemetry) recordTokens(ctx context.Context, u llmretry.Usage, attrs ...attribute.KeyValue) {
	for _, p := range [...]struct {
		kind attribute.KeyValue
		n    int64
	}{{semconv.GenAITokenTypeInput, u.InputTokens}, {semconv.GenAITokenTypeOutput, u.OutputTokens}} {
		t.tokens.Record(ctx, p.n, metric.WithAttributes(append(attrs[:len(attrs):len(attrs)], p.kind)...))
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
// one assistant message with one text part and its finish reason, which
// the schema requires. An answer without one ended as the chain accepts
// an answer, whole: "stop".
func outputMessages(comp llmretry.Completion) string {
	type part struct {
		Type    string `json:"type"`
		Content string `json:"content"`
	}
	type message struct {
		Role         string `json:"role"`
		Parts        []part `json:"parts"`
		FinishReason string `json:"finish_reason"`
	}
	reason := comp.StopReason
	if reason == "" {
		reason = "stop"
	}
	b, _ := json.Marshal([]message{{Role: "assistant", Parts: []part{{"text", comp.Text}}, FinishReason: reason}}) // strings always encode
	return string(b)
}

// firstLine is s up to its first newline: a span's status is one line,
// and an Exhausted's message lists every attempt on the lines after.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
