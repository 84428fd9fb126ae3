// Command quickstart runs a fallback chain over two simulated backends: the
// first answers 503 twice and then 429, the second answers. It prints each attempt as it ends, then the answer.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/llmretry/llmretry"
)

func main() {
	// The primary model is having an outage: two 503s, then a rate limit.
	primaryFailures := []*llmretry.Failure{
		llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("upstream connect error")),
		llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("upstream connect error")),
		llmretry.StatusFailure(http.StatusTooManyRequests, http.Header{"Retry-After-Ms": {"50"}}, errors.New("rate limited")),
	}
	primaryCalls := 0
	primary := func(ctx context.Context, prompt string) (string, error) {
		f := primaryFailures[min(primaryCalls, len(primaryFailures)-1)]
		primaryCalls++
		return "", f
	}
	secondary := func(ctx context.Context, prompt string) (string, error) {
		return "Paris is the capital of France.", nil
	}

	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{
				Model: "gpt-4o",
				Call:  primary,
				// Two retries after 10ms and 30ms. The context has no
				// deadline, so the list is the bound: after the third
				// failure the chain fails over to the next model. (Under a
				// deadline the last wait would repeat while Reserve fits.)
				Retry:   llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}},
				Timeout: 30 * time.Second,
			},
			{Model: "claude-sonnet", Call: secondary, Timeout: 30 * time.Second},
		},
		// Each record's line ends with what the chain did next, and why.
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) { fmt.Println(a) },
	}

	answer, err := chain.Do(context.Background(), "What is the capital of France?")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if !llmretry.RetryItem(err) {
			fmt.Fprintln(os.Stderr, "re-running this item will not help")
		}
		os.Exit(1)
	}
	fmt.Println("answer:", answer)
}
