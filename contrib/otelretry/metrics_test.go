package otelretry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// point is one data point as the tests compare it: a histogram's count
// and sum, or a sum's or gauge's value.
type point struct {
	Metric string
	Attrs  string // encoded, keys sorted
	Count  uint64
	Value  float64
}

// points flattens rm's data points of the metrics named in scope (every
// scope when ""), sorted.
func points(rm metricdata.ResourceMetrics, scope string) []point {
	var out []point
	enc := func(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }
	for _, sm := range rm.ScopeMetrics {
		if scope != "" && sm.Scope.Name != scope {
			continue
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					// Durations are the clock's: only their count is compared.
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Count: dp.Count})
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Count: dp.Count, Value: float64(dp.Sum)})
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Value: float64(dp.Value)})
				}
			case metricdata.Sum[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Value: dp.Value})
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Value: float64(dp.Value)})
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					out = append(out, point{Metric: m.Name, Attrs: enc(dp.Attributes), Value: dp.Value})
				}
			default:
				out = append(out, point{Metric: m.Name, Attrs: "unread data type"})
			}
		}
	}
	slices.SortFunc(out, func(a, b point) int {
		return strings.Compare(a.Metric+"|"+a.Attrs, b.Metric+"|"+b.Attrs)
	})
	return out
}

// TestMetrics plays two calls of a chain whose first backend has a
// Breaker: the first fails over from a 503, which opens it, to a
// truncation; the second skips it and is answered. Operations are counted
// once each, a failed one charged to the backend asked first, an answered
// one to the backend that answered; every request's tokens are counted,
// the truncated attempt's apart from the answer's; the breaker is open
// with one opening.
func TestMetrics(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(503))
	r.srv.Script("gpt-4o-mini", llmretrytest.Truncated("Paris is"), llmretrytest.Answer("Paris is the capital."))
	first := r.chat("gpt-4o")
	first.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: time.Hour}
	c := r.instrument(&chain{Backends: []backend{first, r.chat("gpt-4o-mini")}})

	ctx := context.Background()
	if _, err := c.Do(ctx, "q"); !errors.As(err, new(*llmretry.Truncated)) {
		t.Fatalf("first Do() = %v, want a *Truncated", err)
	}
	if _, err := c.Do(ctx, "q"); err != nil {
		t.Fatalf("second Do() = %v, want nil", err)
	}

	srv := r.server(t)
	server := fmt.Sprintf("server.address=%s,server.port=%d", srv["server.address"], srv["server.port"])
	const (
		op   = "gen_ai.operation.name=chat,gen_ai.provider.name=openai,"
		big  = op + "gen_ai.request.model=gpt-4o"
		mini = op + "gen_ai.request.model=gpt-4o-mini"
	)
	want := []point{
		{Metric: "gen_ai.client.operation.duration", Attrs: "error.type=truncated," + big, Count: 1},
		{Metric: "gen_ai.client.operation.duration", Attrs: mini + ",gen_ai.response.model=gpt-4o-mini," + server, Count: 1},
		// The answer: 10 input tokens, and one output token a word.
		{Metric: "gen_ai.client.token.usage", Attrs: mini + ",gen_ai.response.model=gpt-4o-mini,gen_ai.token.type=input," + server, Count: 1, Value: 10},
		{Metric: "gen_ai.client.token.usage", Attrs: mini + ",gen_ai.response.model=gpt-4o-mini,gen_ai.token.type=output," + server, Count: 1, Value: 4},
		// The truncation was billed too, and says it failed.
		{Metric: "gen_ai.client.token.usage", Attrs: mini + ",gen_ai.token.type=input,llmretry.failed=true," + server, Count: 1, Value: 10},
		{Metric: "gen_ai.client.token.usage", Attrs: mini + ",gen_ai.token.type=output,llmretry.failed=true," + server, Count: 1, Value: 2},
		{Metric: "llmretry.attempts", Attrs: big + ",llmretry.kind=transient,llmretry.next=fail_over,llmretry.skipped=true,llmretry.why=breaker", Value: 1},
		{Metric: "llmretry.attempts", Attrs: big + ",llmretry.kind=transient,llmretry.next=fail_over,llmretry.why=waits_used", Value: 1},
		{Metric: "llmretry.attempts", Attrs: mini, Value: 1},
		{Metric: "llmretry.attempts", Attrs: mini + ",llmretry.kind=truncated,llmretry.next=stop,llmretry.why=not_retryable", Value: 1},
		{Metric: "llmretry.breaker.openings", Attrs: big + ",llmretry.backend=0", Value: 1},
		{Metric: "llmretry.breaker.state", Attrs: big + ",llmretry.backend=0", Value: 1},
	}
	got := points(r.collect(t), scope)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// TestPoolMetrics plays a call to a pool whose first deployment, east,
// fails with a 503 that opens its Breaker, and whose second, west,
// served by Azure OpenAI, answers: the attempts are counted by
// deployment, each with its own provider, and each deployment's Breaker
// is observed apart, named by the pool's place in the chain and its
// deployment.
func TestPoolMetrics(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Status(503), llmretrytest.Answer("Paris."))
	pool := r.pool()
	pool.Pool[0].Backend.Breaker = &llmretry.Breaker{Failures: 1, Cooldown: time.Hour}
	if _, err := r.instrument(&chain{Backends: []backend{pool}}).Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}

	srv := r.server(t)
	server := fmt.Sprintf("server.address=%s,server.port=%d", srv["server.address"], srv["server.port"])
	const (
		openai = "gen_ai.operation.name=chat,gen_ai.provider.name=openai,gen_ai.request.model=gpt-4o"
		azure  = "gen_ai.operation.name=chat,gen_ai.provider.name=azure.ai.openai,gen_ai.request.model=gpt-4o"
	)
	want := []point{
		{Metric: "gen_ai.client.operation.duration", Attrs: azure + ",gen_ai.response.model=gpt-4o," + server, Count: 1},
		{Metric: "gen_ai.client.token.usage", Attrs: azure + ",gen_ai.response.model=gpt-4o,gen_ai.token.type=input," + server, Count: 1, Value: 10},
		{Metric: "gen_ai.client.token.usage", Attrs: azure + ",gen_ai.response.model=gpt-4o,gen_ai.token.type=output," + server, Count: 1, Value: 1},
		{Metric: "llmretry.attempts", Attrs: azure + ",llmretry.deployment=west", Value: 1},
		{Metric: "llmretry.attempts", Attrs: openai + ",llmretry.deployment=east,llmretry.kind=transient,llmretry.next=retry", Value: 1},
		{Metric: "llmretry.breaker.openings", Attrs: azure + ",llmretry.backend=0,llmretry.deployment=west", Value: 0},
		{Metric: "llmretry.breaker.openings", Attrs: openai + ",llmretry.backend=0,llmretry.deployment=east", Value: 1},
		{Metric: "llmretry.breaker.state", Attrs: azure + ",llmretry.backend=0,llmretry.deployment=west", Value: 0},
		{Metric: "llmretry.breaker.state", Attrs: openai + ",llmretry.backend=0,llmretry.deployment=east", Value: 1},
	}
	got := points(r.collect(t), scope)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}
