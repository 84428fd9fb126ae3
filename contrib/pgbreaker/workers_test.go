package pgbreaker_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// worker is one worker process: this test binary re-executed, which
// TestMain turns to a worker's script by its environment.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr strings.Builder
}

// startWorkers starts n worker processes, worker i (from 1) with env(i)
// added to the environment, waits until each says "ready", and hands
// them all the same start, 200 ms from now, on stdin: the scripts'
// offsets count from it.
func startWorkers(t *testing.T, n int, env func(i int) []string) ([]*worker, time.Time) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable() = %v", err)
	}
	workers := make([]*worker, n)
	for i := range workers {
		w := &worker{cmd: exec.Command(exe, "-test.run=^$")}
		w.cmd.Env = append(os.Environ(), env(i+1)...)
		w.cmd.Stderr = &w.stderr
		if w.stdin, err = w.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := w.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		w.stdout = bufio.NewScanner(stdout)
		if err := w.cmd.Start(); err != nil {
			t.Fatalf("starting worker %d: %v", i+1, err)
		}
		workers[i] = w
	}
	for i, w := range workers {
		if !w.stdout.Scan() || w.stdout.Text() != "ready" {
			_ = w.cmd.Wait()
			t.Fatalf("worker %d did not say ready: %q; stderr:\n%s", i+1, w.stdout.Text(), w.stderr.String())
		}
	}
	start := time.Now().Add(200 * time.Millisecond)
	for _, w := range workers {
		fmt.Fprintln(w.stdin, start.UnixNano())
		w.stdin.Close()
	}
	return workers, start
}

// readWorkers reads what the workers write, one JSON value a line, until
// every one has exited, and returns it all; a line that does not decode,
// or a worker that fails, fails the test. Each worker is read on a
// goroutine of its own, so that none blocks on a full pipe while another
// is read.
func readWorkers[T any](t *testing.T, workers []*worker) []T {
	t.Helper()
	var (
		out  []T
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for i, w := range workers {
		wg.Go(func() {
			var recs []T
			var bad []error
			for w.stdout.Scan() {
				var r T
				if err := json.Unmarshal(w.stdout.Bytes(), &r); err != nil {
					bad = append(bad, fmt.Errorf("worker %d wrote %q: %v", i+1, w.stdout.Text(), err))
					continue
				}
				recs = append(recs, r)
			}
			if err := w.cmd.Wait(); err != nil {
				bad = append(bad, fmt.Errorf("worker %d: %v; stderr:\n%s", i+1, err, w.stderr.String()))
			}
			mu.Lock()
			defer mu.Unlock()
			out = append(out, recs...)
			errs = append(errs, bad...)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}
