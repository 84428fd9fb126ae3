// Command starter runs the summarize_items workflow over a number of
// items on a worker of examples/temporal (see ./worker), waits for it,
// and prints what became of each item: its answer, or its dead letter.
//
//	go run ./starter -items 20
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/llmretry/llmretry/contrib/temporalretry"
	"github.com/llmretry/llmretry/examples/temporal/summarize"
)

func main() {
	addr := flag.String("address", envOr("LLMRETRY_TEMPORAL_ADDR", "127.0.0.1:7233"), "the Temporal server's `host:port`")
	items := flag.Int("items", 20, "how many items to summarize")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Dial(client.Options{HostPort: *addr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starter:", err)
		os.Exit(1)
	}
	defer c.Close()
	id := fmt.Sprintf("summarize-%d", time.Now().UnixNano())
	sum, err := summarize.Start(ctx, c, summarize.TaskQueue, id, summarize.Items(*items))
	if err != nil {
		fmt.Fprintln(os.Stderr, "starter:", err)
		os.Exit(1)
	}
	report(os.Stdout, sum)
}

// report writes the summary: the items done, then the dead letters, each
// with why it is dead, its runs and its last run's outcome.
func report(w io.Writer, sum summarize.Summary) {
	done := make([]string, 0, len(sum.Done))
	for id := range sum.Done {
		done = append(done, id)
	}
	sort.Strings(done)
	fmt.Fprintf(w, "done: %d items\n", len(done))
	for _, id := range done {
		fmt.Fprintf(w, "  %-8s %s\n", id, sum.Done[id])
	}
	fmt.Fprintf(w, "dead: %d items\n", len(sum.Dead))
	for _, dl := range sum.Dead {
		fmt.Fprintf(w, "  %-8s %-13s after %d run(s): %s\n", dl.ID, dl.Why, dl.Runs, lastOutcome(dl))
	}
}

// lastOutcome is the outcome of a dead letter's last run, as its record
// says, and its attempts.
func lastOutcome(dl temporalretry.DeadLetter) string {
	var rec struct {
		Outcome  string            `json:"outcome"`
		Attempts []json.RawMessage `json:"attempts"`
	}
	if err := json.Unmarshal(dl.Error, &rec); err != nil || rec.Outcome == "" {
		return string(dl.Error)
	}
	return fmt.Sprintf("%s, %d attempts", rec.Outcome, len(rec.Attempts))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
