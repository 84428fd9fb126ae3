package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/llmretry/llmretry/examples/temporal/summarize"
)

// TestRun runs the worker against a real Temporal server, when
// LLMRETRY_TEMPORAL_ADDR names one (as .ci/run sets it), starts the
// workflow over ten items as the starter does, and checks what became of
// them and that the worker printed the dead letters.
func TestRun(t *testing.T) {
	addr := os.Getenv("LLMRETRY_TEMPORAL_ADDR")
	if addr == "" {
		t.Skip("LLMRETRY_TEMPORAL_ADDR is not set; start a server with .ci/temporal.sh")
	}
	queue := fmt.Sprintf("llmretry-summarize-test-%d", time.Now().UnixNano())
	ctx, stop := context.WithCancel(t.Context())
	var (
		dead, logw syncBuffer
		wg         sync.WaitGroup
		runErr     error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		runErr = run(ctx, addr, queue, 10, &dead, &logw)
	}()

	c, err := client.Dial(client.Options{HostPort: addr})
	if err != nil {
		t.Fatalf("client.Dial() = %v", err)
	}
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	sum, err := summarize.Start(sctx, c, queue, queue, summarize.Items(10))
	stop()
	wg.Wait()
	if err != nil {
		t.Fatalf("Start() = %v; worker's log:\n%s", err, logw.String())
	}
	if runErr != nil {
		t.Fatalf("run() = %v", runErr)
	}
	if len(sum.Done) != 6 || len(sum.Dead) != 4 {
		t.Errorf("summary: %d done, %d dead; want 6 and 4", len(sum.Done), len(sum.Dead))
	}
	if n := strings.Count(dead.String(), "\n"); n != 4 {
		t.Errorf("the worker printed %d dead letters, want 4:\n%s", n, dead.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the worker's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
