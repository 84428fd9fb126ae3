package otelretry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/otelretry"
)

// A nil chain is bad input: it gets the chain's own configuration error,
// not a panic.
func TestInstrumentNilChain(t *testing.T) {
	c := otelretry.Instrument[string, string](nil, otelretry.Config{})
	_, err := c.Do(context.Background(), "hi")
	if !errors.Is(err, llmretry.ErrConfig) {
		t.Errorf("Do() on an instrumented nil chain: error = %v, want one matching ErrConfig", err)
	}
}
