package main

import (
	"encoding/json"
	"os"

	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/contrib/temporalretry"
	"github.com/llmretry/llmretry/examples/temporal/summarize"
)

// The starter's report of a summary.
func Example_report() {
	report(os.Stdout, summarize.Summary{
		Done: map[string]string{"item-1": "The summary of item-1.", "item-0": "The summary of item-0."},
		Dead: []temporalretry.DeadLetter{
			{ID: "item-3", Why: batch.WhyNotRetryable, Runs: 1, Error: json.RawMessage(`{"outcome":"truncated","attempts":[{},{}]}`)},
			{ID: "item-4", Why: batch.WhyRunsUsed, Runs: 3, Error: json.RawMessage(`{"outcome":"exhausted","attempts":[{},{},{},{}]}`)},
		},
	})
	// Output:
	// done: 2 items
	//   item-0   The summary of item-0.
	//   item-1   The summary of item-1.
	// dead: 2 items
	//   item-3   not_retryable after 1 run(s): truncated, 2 attempts
	//   item-4   runs_used     after 3 run(s): exhausted, 4 attempts
}
