package llmretrytest

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// isServerGoroutine reports whether the stack g is a Server's: its Serve
// loop, its connections or its handlers.
func isServerGoroutine(g string) bool {
	return strings.Contains(g, "net/http.(*conn).serve") ||
		strings.Contains(g, "net/http.(*Server).Serve") ||
		strings.Contains(g, "llmretrytest.(*Server)") ||
		strings.Contains(g, "llmretrytest.(*exchange)")
}

// goroutines returns the stacks of the goroutines that match.
func goroutines(match func(stack string) bool) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var ours []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if match(g) {
			ours = append(ours, g)
		}
	}
	return ours
}

// settledServerGoroutines returns the server goroutines that are still
// there after a bound far above the time a returning goroutine needs.
func settledServerGoroutines() []string { return settledGoroutines(isServerGoroutine) }

// settledGoroutines returns the goroutines that match and are still there
// after a bound far above the time a returning goroutine needs.
func settledGoroutines(match func(stack string) bool) []string {
	deadline := time.Now().Add(5 * time.Second)
	left := goroutines(match)
	for len(left) > 0 && time.Now().Before(deadline) {
		runtime.Gosched()
		left = goroutines(match)
	}
	return left
}

// Close leaves no goroutine behind: not the Serve loop, not a connection,
// not a handler, whatever state the requests were in. The test is not
// parallel, so the only servers running are its own.
func TestCloseLeaksNoGoroutine(t *testing.T) {
	// Earlier tests closed their servers, but a connection's goroutine may
	// still be on its way out.
	if left := settledServerGoroutines(); len(left) > 0 {
		t.Fatalf("server goroutines before the test (another test leaked):\n%s", strings.Join(left, "\n\n"))
	}
	s, tr := traceServer(t)
	s.Script("stall", StallHeaders())
	s.Script("stream", StreamStall(1))
	s.Script("slow", Answer("late").After(time.Hour))
	s.Script("ok", Answer("done"))
	c := newClient(t)

	// One request answered in full, besides the stalled ones.
	if got := call(t, c, s, "openai", "ok", true); got.err != nil {
		t.Fatal(got.err)
	}
	waitFor(t, tr.arrived, "the answered request")
	var wg sync.WaitGroup
	for _, model := range []string{"stall", "stream", "slow"} {
		for _, api := range []string{"openai", "anthropic"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(context.Background(), c, s, paths[api], requestBody(api, model, true))
			}()
			waitFor(t, tr.arrived, "request")
		}
	}
	s.Close()
	// Close returns only once every handler has: all seven have ended.
	if n := len(tr.ended); n != 7 {
		t.Errorf("%d handlers had ended when Close returned, want 7", n)
	}
	wg.Wait()

	// The connections' goroutines were done with their handlers before
	// Close returned, but may still be returning from net/http's code, so
	// allow them a moment.
	if left := settledServerGoroutines(); len(left) > 0 {
		t.Errorf("%d server goroutines left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}
