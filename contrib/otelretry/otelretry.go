package otelretry

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmretry/llmretry"
)

// scope names the tracer and meter, as the conventions ask: the
// instrumentation's import path.
const scope = "github.com/llmretry/llmretry/contrib/otelretry"

// Config says where an instrumented chain's telemetry goes and what it
// holds. The zero Config sends it to the global providers, names the
// operation "chat", takes each backend's provider from its
// [llmretry.Backend.Provider] (else guesses it from its model's name with
// [GuessProvider]), and records no text.
type Config struct {
	// TracerProvider makes the spans. nil means otel.GetTracerProvider()
	// at the time of Instrument.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. nil means otel.GetMeterProvider()
	// at the time of Instrument.
	MeterProvider metric.MeterProvider
	// Operation is gen_ai.operation.name and the first word of the
	// inference spans' names, such as "chat" or "generate_content". ""
	// means "chat".
	Operation string
	// Provider, when set, names the provider behind backend i, whose
	// Model is model ("unknown" when empty), for gen_ai.provider.name:
	// "openai", "anthropic", "azure.ai.openai", "aws.bedrock", ... It is
	// asked once per backend, by Instrument, and its answer overrides the
	// backend's own Provider, for a client pointed at a service its
	// adapter cannot tell apart (Azure OpenAI through openairetry). An
	// empty answer, or a nil Provider, leaves it to the backend's
	// Provider, then to [GuessProvider] of the model, then to "_OTHER":
	// the attribute is required, and a wrong provider would mislead more
	// than the conventions' word for one not known. For a backend that is
	// a pool it is asked again for each deployment, with the pool's i and
	// the deployment's model, and its answer overrides the deployment's
	// Provider, which falls back on the pool's.
	Provider func(i int, model string) string
	// RecordContent records the answer's text, as gen_ai.output.messages,
	// on the call's span and the span of the attempt that answered, and
	// each failed attempt's raw output on its span, as llmretry.raw_text,
	// when the answer is an [llmretry.Completion]. Both may hold user
	// data, so the conventions make them opt-in; false records neither.
	// The request is never recorded: its type is the caller's own.
	RecordContent bool
}

// Instrument returns a copy of c that traces and measures every call of
// Do as the package doc describes; c itself is left as it was. Build the
// chain as usual, then instrument it once and keep the copy: Instrument
// reads the backends' Provider, Stream and Breaker once, and those of a
// pool's deployments, and registers the Breakers with the MeterProvider
// for the provider's lifetime. The
// copy's OnAttempt, OnAttemptStart and WrapDo run c's own, if set, inside
// the instrumentation's. For a nil c it returns nil, whose Do reports the
// chain as nil, as c's would have.
func Instrument[Req, Resp any](c *llmretry.Chain[Req, Resp], cfg Config) *llmretry.Chain[Req, Resp] {
	if c == nil {
		return nil
	}
	backends := make([]backendInfo, len(c.Backends))
	for i := range c.Backends {
		b := &c.Backends[i]
		model := modelName(b.Model)
		backends[i] = backendInfo{
			index: i, model: model, stream: b.Stream, breaker: b.Breaker,
			provider: providerOf(cfg.Provider, i, model, b.Provider),
		}
		for j := range b.Pool {
			d := &b.Pool[j].Backend
			model := modelName(d.Model)
			backends[i].pool = append(backends[i].pool, backendInfo{
				index: i, model: model, stream: d.Stream, breaker: d.Breaker, deployment: b.Pool[j].Name,
				// A deployment that does not say who serves it is
				// served by whoever the pool says.
				provider: providerOf(cfg.Provider, i, model, cmp.Or(d.Provider, b.Provider)),
			})
		}
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
		ctx = t.attemptStart(ctx, bi, model, try)
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

// unknownModel is the name the chain's records give a backend without a
// Model.
const unknownModel = "unknown"

// backendInfo is what the telemetry keeps of one backend, or of one
// deployment of a backend that is a pool: the chain is immutable, so it
// is read once.
type backendInfo struct {
	index      int
	model      string // as the records name it: unknownModel for none
	provider   string // never empty
	stream     bool
	breaker    *llmretry.Breaker
	deployment string        // a deployment's name; "" for a backend
	pool       []backendInfo // a pool's deployments, in its order
}

// deploymentOf is deployment name of b, a pool, as Instrument read it;
// or b itself with that name, for a deployment b does not have (a record
// a caller's own hook made up).
func (b backendInfo) deploymentOf(name string) backendInfo {
	for _, d := range b.pool {
		if d.deployment == name {
			return d
		}
	}
	b.deployment = name
	return b
}

// modelName is the name the chain's records give a model.
func modelName(model string) string {
	if model == "" {
		return unknownModel
	}
	return model
}

// call is the state of one instrumented Do. Do runs its attempts and
// hooks on its own goroutine, one at a time, so it needs no lock.
type call struct {
	span    trace.Span
	attempt *attempt // the attempt in flight; nil between attempts
	answer  *attempt // the attempt that answered, its span left open for the answer's attributes
}

// attempt is the state of one request sent: its inference span, where
// the request went, and, once it has ended, its record.
type attempt struct {
	span    trace.Span
	backend backendInfo
	server  server           // filled by the request's HTTP client, on any goroutine
	nested  atomic.Bool      // an instrumented chain ran under it, and its spans carry the usage
	record  llmretry.Attempt // set when the attempt ends
}

// callKey finds an instrumentation's innermost call in a context. Each
// Instrument has its own key, so a chain instrumented twice keeps two
// calls apart; a chain nested in itself puts its inner call above the
// outer, and each Do's hooks get its own context, so each finds its own.
type callKey struct{ t *telemetry }

// attemptKey finds the innermost attempt of any instrumented chain in the
// context a backend's Call runs under, for a chain nested in that Call to
// mark it.
type attemptKey struct{}

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
		for _, a := range [...]*attempt{c.attempt, c.answer} {
			if a != nil {
				a.span.SetStatus(codes.Error, "otelretry: the call panicked")
				a.span.End()
			}
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
	return semconv.ErrorTypeOther.Value.AsString()
}

// handle reports an error of the OpenTelemetry API, such as an instrument
// it could not make, where the application set errors to go.
func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
