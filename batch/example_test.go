package batch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// Three items through a chain whose backend is a fake: the first is
// answered, the second is cut off at the token budget every time, and the
// third fails once and is answered on its second run.
func Example() {
	runs := map[string]int{}
	call := func(ctx context.Context, prompt string) (string, error) {
		runs[prompt]++ // Concurrency 1 below, so no lock is needed
		switch {
		case prompt == "a long essay":
			cut := llmretry.Truncation("It was the best of")
			cut.Usage = &llmretry.Usage{InputTokens: 10, OutputTokens: 100} // billed in full
			return "", cut
		case prompt == "a haiku" && runs[prompt] == 1:
			return "", llmretry.StatusFailure(503, nil, errors.New("overloaded"))
		}
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 10, OutputTokens: 20}) // as an adapter does for its answers
		return "an answer to " + prompt, nil
	}
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{Model: "gpt-4o", Call: call}},
	}

	r := &batch.Runner[string, string]{
		Chain:       chain,
		Concurrency: 1,
		Waits:       []time.Duration{time.Millisecond}, // minutes in production
		OnResult: func(item batch.Item[string], answer string) {
			fmt.Printf("%s: %s\n", item.ID, answer)
		},
		// In production: batch.JSONLines(file).
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			fmt.Printf("%s: dead after %d run(s), item retryable: %t\n", d.ID, d.Runs, llmretry.RetryItem(d.Err))
			return nil
		}),
	}
	items := []batch.Item[string]{
		{ID: "q1", Req: "a question"},
		{ID: "q2", Req: "a long essay"},
		{ID: "q3", Req: "a haiku"},
	}
	counts, err := r.Run(context.Background(), slices.Values(items))
	fmt.Println(counts, err)
	// Items finish in any order, even one at a time: a dead letter may be
	// written before an earlier item's answer is handed over.

	// Unordered output:
	// q1: an answer to a question
	// q2: dead after 1 run(s), item retryable: false
	// q3: an answer to a haiku
	// 3 items: 2 succeeded, 1 dead, 0 not run; tokens 30 in, 140 out <nil>
}
