package llmretry_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// Two processes, here two Breakers in one program, share one backend's
// state through a store: the failures one of them sees open the backend
// for the other, whose call skips it without sending anything. A real
// fleet would use a store on a database, with the same Key everywhere.
func ExampleBreakerStore() {
	store := &llmretrytest.MemoryStore{}
	newChain := func() *llmretry.Chain[string, string] {
		down := func(context.Context, string) (string, error) {
			return "", llmretry.StatusFailure(503, nil, errors.New("unavailable"))
		}
		up := func(_ context.Context, req string) (string, error) { return "fallback: " + req, nil }
		return &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: down, Breaker: &llmretry.Breaker{Store: store, Key: "openai/gpt-4o"}},
			{Model: "fallback", Call: up},
		}}
	}
	first, second := newChain(), newChain()
	for range llmretry.DefaultBreakerFailures {
		first.Do(context.Background(), "q")
	}
	var attempts []llmretry.Attempt
	second.OnAttempt = func(_ context.Context, a llmretry.Attempt) { attempts = append(attempts, a) }
	resp, err := second.Do(context.Background(), "q")
	fmt.Println(resp, err)
	fmt.Println("skipped gpt-4o:", attempts[0].Skipped, attempts[0].Why)
	fmt.Println("open for the second process:", second.Backends[0].Breaker.State().Open)
	// Output:
	// fallback: q <nil>
	// skipped gpt-4o: true breaker
	// open for the second process: true
}
