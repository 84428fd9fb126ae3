package llmretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/llmretry/llmretry"
)

// The error Do returns answers errors.Is and errors.As for the chain's
// outcome only. The providers' own errors are the records' Err: to reach
// the last one, take the last record that has an Err (a skip for a breaker
// sent nothing) and look into it.
func Example_lastProviderError() {
	primary := func(ctx context.Context, prompt string) (string, error) {
		return "", llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("upstream connect error"))
	}
	fallback := func(ctx context.Context, prompt string) (string, error) {
		return "", llmretry.StatusFailure(http.StatusBadRequest, nil, errors.New("prompt is too long"))
	}
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: primary},
			{Model: "claude-sonnet", Call: fallback},
		},
	}

	_, err := chain.Do(context.Background(), "hello")

	var failure *llmretry.Failure
	fmt.Println("errors.As(err, *Failure):", errors.As(err, &failure))

	var exhausted *llmretry.Exhausted // a Truncated or TimedOut is one too
	if errors.As(err, &exhausted) {
		for i := len(exhausted.Attempts) - 1; i >= 0; i-- {
			if last := exhausted.Attempts[i]; last.Err != nil {
				if errors.As(last.Err, &failure) {
					fmt.Printf("last provider error: %s from %s (status %d)\n", failure, last.Model, failure.Status)
				}
				break
			}
		}
	}
	// Output:
	// errors.As(err, *Failure): false
	// last provider error: http 400: prompt is too long from claude-sonnet (status 400)
}

// A call cancelled by an errgroup whose sibling failed is a Cancelled, and
// nothing of the sibling's error is in its tree: the sibling's error is
// the Cause, a field to read.
func ExampleCancelled_cause() {
	sibling := llmretry.StatusFailure(http.StatusBadRequest, nil, errors.New("bad request"))
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(sibling) // as errgroup does with the first error

	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{Model: "gpt-4o", Call: func(context.Context, string) (string, error) { return "hi", nil }}},
	}
	_, err := chain.Do(ctx, "hello")

	var failure *llmretry.Failure
	fmt.Println("errors.Is(err, context.Canceled):", errors.Is(err, context.Canceled))
	fmt.Println("errors.As(err, *Failure):", errors.As(err, &failure))
	var cancelled *llmretry.Cancelled
	if errors.As(err, &cancelled) {
		fmt.Println("Cause:", cancelled.Cause)
	}
	// Output:
	// errors.Is(err, context.Canceled): true
	// errors.As(err, *Failure): false
	// Cause: http 400: bad request
}
