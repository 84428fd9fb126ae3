package otelretry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
)

// scope names the tracer and meter, as the conventions ask: the
// instrumentation's import path.
const scope = "github.com/llmretry/llmretry/contrib/otelretry"

// Config says where an instrumented chain's telemetry goes and what it
// holds. The zero Config sends it to the global providers, names the
// operation "chat", guesses each backend's provider from its model's
// name with [GuessProvider], and records no text.
type Config struct {
	// TracerProvider makes the spans. nil means otel.GetTracerProvider()
	// at the time of Instrument.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. nil means otel.GetMeterProvider()
	// at the time of Instrument.
	MeterProvider metric.MeterProvider
	// Operation is gen_ai.operation.name and the first word of the call
	// span's name, such as "chat" or "text_completion". "" means "chat".
	Operation string
	// Provider names the provider behind backend i, whose Model is
	// model ("unknown" when empty), for gen_ai.provider.name: "openai",
	// "anthropic", "azure.ai.openai", "aws.bedrock", ... It is asked once
	// per backend, by Instrument. An empty name leaves the attribute out.
	// nil means [GuessProvider] of the model, which cannot tell OpenAI's
	// own API from Azure's or a proxy's: name them here when it matters.
	Provider func(i int, model string) string
	// RecordContent records the answer's text on the call span, as
	// gen_ai.output.messages, and each failed attempt's raw output on its
	// span, as llmretry.raw_text, when the answer is an
	// [llmretry.Completion]. Both may hold user data, so the conventions
	// make them opt-in; false records neither. The request is never
	// recorded: its type is the caller's own.
	RecordContent bool
}

// Instrument returns a copy of c that traces and measures every call of
// Do as the package doc describes; c itself is left as it was. Build the
// chain as usual, then instrument it once and keep the copy: each
// Instrument registers its backends' Breakers with the MeterProvider for
// the provider's lifetime. The copy's OnAttempt, OnAttemptStart and WrapDo
// run c's own, if set, inside the instrumentation's. For a nil c it
// returns nil, whose Do reports the chain as nil, as c's would have.
func Instrument[Req, Resp any](c *llmretry.Chain[Req, Resp], cfg Config) *llmretry.Chain[Req, Resp] {
	if c == nil {
		return nil
	}
	backends := make([]backendInfo, len(c.Backends))
	for i := range c.Backends {
		b := &c.Backends[i]
		backends[i] = backendInfo{index: i, model: modelName(b.Model), breaker: b.Breaker}
	}
	t := newTelemetry(cfg, backends)

	cp := *c
	userWrap, userStart, userAttempt := c.WrapDo, c.OnAttemptStart, c.OnAttempt
	cp.WrapDo = func(ctx context.Context, do func(context.Context) (Resp, error)) (Resp, error) {
		return wrapDo(t, ctx, func(ctx context.Context) (Resp, error) {
			if userWrap != nil {
				return userWrap(ctx, do)
			}
			return do(ctx)
		})
	}
	cp.OnAttemptStart = func(ctx context.Context, bi int, model string, try int) context.Context {
		ctx = t.attemptStart(ctx, bi, try)
		if userStart != nil {
			if uc := userStart(ctx, bi, model, try); uc != nil {
				ctx = uc
			}
		}
		return ctx
	}
	cp.OnAttempt = func(ctx context.Context, a llmretry.Attempt) {
		t.attemptEnd(ctx, a)
		if userAttempt != nil {
			userAttempt(ctx, a)
		}
	}
	return &cp
}

// backendInfo is what the telemetry keeps of one backend: the chain is
// immutable, so it is read once.
type backendInfo struct {
	index    int
	model    string
	provider string
	breaker  *llmretry.Breaker
}

// modelName is the name the chain's records give a model.
func modelName(model string) string {
	if model == "" {
		return "unknown"
	}
	return model
}

// call is the state of one instrumented Do. Do runs its attempts and
// hooks on its own goroutine, one at a time, so it needs no lock.
type call struct {
	span    trace.Span
	attempt trace.Span        // the span of the attempt in flight; nil between attempts
	answer  *llmretry.Attempt // the record of the attempt that answered
}

// callKey finds an instrumentation's innermost call in a context. Each
// Instrument has its own key, so a chain instrumented twice keeps two
// calls apart; a chain nested in itself puts its inner call above the
// outer, and each Do's hooks get its own context, so each finds its own.
type callKey struct{ t *telemetry }

// callOf returns the call of t that ctx belongs to, or nil.
func (t *telemetry) callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{t}).(*call)
	return c
}

// wrapDo runs one Do (do) inside its call span and records its duration.
func wrapDo[Resp any](t *telemetry, ctx context.Context, do func(context.Context) (Resp, error)) (Resp, error) {
	ctx, c, began := t.callStart(ctx)
	finished := false
	defer func() {
		if finished {
			return
		}
		// A Call panicked: end what is open, so the trace is not left
		// dangling, and let the panic go on.
		if c.attempt != nil {
			c.attempt.SetStatus(codes.Error, "otelretry: the call panicked")
			c.attempt.End()
		}
		c.span.SetStatus(codes.Error, "otelretry: the call panicked")
		c.span.End()
	}()
	resp, err := do(ctx)
	finished = true
	t.callEnd(ctx, c, began, resp, err)
	return resp, err
}

// outcome is the error.type of a call's error: the outcome's name as the
// error's JSON gives it, or "_OTHER" for an error that is none of the
// chain's four (a configuration error, or a WrapDo of the caller's own).
func outcome(err error) string {
	if _, ok := errors.AsType[*llmretry.Cancelled](err); ok {
		return "cancelled"
	}
	// Truncated and TimedOut embed Exhausted: ask for them first.
	if _, ok := errors.AsType[*llmretry.Truncated](err); ok {
		return "truncated"
	}
	if _, ok := errors.AsType[*llmretry.TimedOut](err); ok {
		return "timed_out"
	}
	if _, ok := errors.AsType[*llmretry.Exhausted](err); ok {
		return "exhausted"
	}
	return "_OTHER"
}

// handle reports an error of the OpenTelemetry API, such as an instrument
// it could not make, where the application set errors to go.
func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
