package llmretry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmretry/llmretry"
)

// A dashboard reads a Breaker's State after each call during an outage of
// the primary: it counts the failures, opens after the third, and from
// then on calls skip the primary for the secondary without sending
// anything to it until it half-opens.
func ExampleBreaker_State() {
	primary := &llmretry.Breaker{Failures: 3, Cooldown: 30 * time.Second}
	down := func(context.Context, string) (string, error) {
		return "", llmretry.StatusFailure(503, nil, fmt.Errorf("upstream unavailable"))
	}
	up := func(_ context.Context, req string) (string, error) { return "secondary: " + req, nil }
	c := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{Model: "primary", Call: down, Breaker: primary},
			{Model: "secondary", Call: up},
		},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			if a.Skipped {
				fmt.Println(" ", a)
			}
		},
	}
	dashboard := func() {
		s := primary.State()
		switch {
		case !s.Open:
			fmt.Printf("primary: closed, %d consecutive failures\n", s.Failures)
		case s.Probing:
			fmt.Println("primary: half-open, probe in flight")
		case time.Now().Before(s.Until):
			fmt.Printf("primary: open after %d %s failures, half-opens in %v\n", s.Failures, s.Kind, time.Until(s.Until).Round(time.Second))
		default:
			fmt.Println("primary: half-open, waiting for a probe")
		}
	}
	for i := 1; i <= 4; i++ {
		got, err := c.Do(context.Background(), fmt.Sprintf("question %d", i))
		fmt.Println(got, err)
		dashboard()
	}
	// Output:
	// secondary: question 1 <nil>
	// primary: closed, 1 consecutive failures
	// secondary: question 2 <nil>
	// primary: closed, 2 consecutive failures
	// secondary: question 3 <nil>
	// primary: open after 3 transient failures, half-opens in 30s
	//   [backend 0 primary try 1] skipped: breaker open after transient failures (failing over: breaker)
	// secondary: question 4 <nil>
	// primary: open after 3 transient failures, half-opens in 30s
}
