// Command worker is a Temporal worker that summarizes items: each item's
// activity runs an llmretry.Chain through temporalretry.Do, against a
// scripted OpenAI-compatible provider that plays an outage (llmretrytest,
// on 127.0.0.1, in this process), and the items that fail for good come
// to its dead-letter activity, which prints them as lines of JSON.
//
// From the repository's root, start Temporal's development server, then
// the worker, then the starter in another terminal:
//
//	export LLMRETRY_TEMPORAL_ADDR="$(bash .ci/temporal.sh)"
//	cd examples/temporal
//	go run ./worker              # until Ctrl-C
//	go run ./starter -items 20
//
// Run more workers to share the items; each scripts its own provider the
// same way, so an item meets the same outage on any of them.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/llmretry/llmretry/examples/temporal/summarize"
	"github.com/llmretry/llmretry/llmretrytest"
)

func main() {
	addr := flag.String("address", envOr("LLMRETRY_TEMPORAL_ADDR", "127.0.0.1:7233"), "the Temporal server's `host:port`")
	items := flag.Int("items", 1000, "how many items (item-0, item-1, ...) the scripted provider knows")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, summarize.TaskQueue, *items, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// run works the task queue until ctx is done: dead letters to dead, a
// line for each failed run to logw.
func run(ctx context.Context, addr, queue string, items int, dead, logw io.Writer) error {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	summarize.Script(srv, items)

	// The SDK logs every failed run as an error; the activity prints its
	// own line instead, so only the SDK's warnings are kept.
	logger := log.NewStructuredLogger(slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelError + 1})))
	c, err := client.Dial(client.Options{HostPort: addr, Logger: logger})
	if err != nil {
		return err
	}
	defer c.Close()
	w := worker.New(c, queue, worker.Options{})
	summarize.Register(w, &summarize.Activities{Chain: summarize.NewChain(srv.OpenAIBaseURL()), Dead: dead, Log: logw})
	if err := w.Start(); err != nil {
		return err
	}
	fmt.Fprintf(logw, "worker: polling %s on %s; Ctrl-C stops\n", queue, addr)
	<-ctx.Done()
	w.Stop()
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
