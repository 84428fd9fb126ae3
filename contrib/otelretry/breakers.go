package otelretry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/llmretry/llmretry"
)

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
		for _, d := range b.pool {
			if d.breaker != nil { // nil only in a chain Do refuses
				watched = append(watched, d)
			}
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
			kv := append(t.modelAttrs(b), keyBackend.Int(b.index))
			if b.deployment != "" {
				kv = append(kv, keyDeployment.String(b.deployment))
			}
			attrs := metric.WithAttributes(kv...)
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
