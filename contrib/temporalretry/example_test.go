package temporalretry_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/temporalretry"
)

// Activities run an item's chain and take its dead letter.
type Activities struct {
	Chain *llmretry.Chain[string, string]
}

// Summarize runs the chain inside the activity: heartbeats, records, and
// the error that Temporal's retries need.
func (a *Activities) Summarize(ctx context.Context, prompt string) (string, error) {
	return temporalretry.Do(ctx, a.Chain, prompt)
}

// DeadLetter stores a dead item; here it prints it.
func (a *Activities) DeadLetter(_ context.Context, dl temporalretry.DeadLetter) error {
	fmt.Printf("dead letter: %s, %s after %d run(s)\n", dl.ID, dl.Why, dl.Runs)
	return nil
}

// The workflow pattern: run each item's activity, and route the items
// that fail for good to the dead-letter activity. Here in the SDK's test
// environment, with a backend that answers one prompt and cuts the other
// off at its token budget: the truncation is dead after one run, without
// using the retry policy's other attempts.
func Example() {
	call := func(_ context.Context, prompt string) (string, error) {
		if prompt == "a long one" {
			return "", llmretry.Truncation("It all began")
		}
		return "A summary of " + prompt + ".", nil
	}
	acts := &Activities{Chain: &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{Model: "gpt-4o", Call: call}},
	}}
	summarizeAll := func(ctx workflow.Context, items []string) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			StartToCloseTimeout: time.Minute,
			HeartbeatTimeout:    10 * time.Second,
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
		})
		for _, item := range items {
			var summary string
			err := workflow.ExecuteActivity(ctx, acts.Summarize, item).Get(ctx, &summary)
			if dl, ok := temporalretry.DeadLetterOf(item, err); ok {
				err = workflow.ExecuteActivity(ctx, acts.DeadLetter, dl).Get(ctx, nil)
			} else if err == nil {
				fmt.Println("done:", summary)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}

	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(acts)
	env.RegisterWorkflow(summarizeAll)
	env.ExecuteWorkflow(summarizeAll, []string{"a short one", "a long one"})
	fmt.Println("workflow error:", env.GetWorkflowError())
	// Output:
	// done: A summary of a short one.
	// dead letter: a long one, not_retryable after 1 run(s)
	// workflow error: <nil>
}
