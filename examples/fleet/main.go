// Command fleet shows two workers sharing one backend's breaker, as two
// processes of a fleet would: what one learns, the other acts on.
//
// Each worker has a Breaker of its own, as a separate process would,
// and both keep its state under one key in a shared store: PostgreSQL
// through contrib/pgbreaker when DATABASE_URL is set, otherwise the
// in-memory store of package llmretrytest, so that the program runs on a
// fresh machine. The backend is a scripted provider (an llmretrytest
// server on 127.0.0.1) that is down at first.
//
//  1. Worker A's calls fail twice: A's breaker opens.
//
//  2. Worker B has sent nothing yet, but its breaker is open too: its
//     call skips the backend without a request.
//
//  3. The backend is back. B's next call waits out the cooldown, probes,
//     and closes the breaker for both.
//
//  4. A's next call goes straight through.
//
//     go run .                                  # in-memory store
//     DATABASE_URL=postgres://... go run .      # PostgreSQL
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

const model = "gpt-4o"

func main() {
	if err := run(os.Stdout, os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// run plays the four steps and writes what each worker sees to w; dbURL
// empty means the in-memory store. It returns an error only when the
// demo did not go as scripted.
func run(w io.Writer, dbURL string) error {
	ctx := context.Background()
	store, where, closeStore, err := openStore(ctx, dbURL)
	if err != nil {
		return err
	}
	defer closeStore()
	fmt.Fprintln(w, "shared store:", where)

	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script(model, llmretrytest.Status(http.StatusServiceUnavailable))

	// The key names the deployment, the same in every process. This one
	// is new at each run, so that a database keeps no state of an
	// earlier run under it.
	key := "examples/fleet/" + model + "/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a := newWorker("A", store, key, srv, w)
	b := newWorker("B", store, key, srv, w)

	fmt.Fprintln(w, "\n1. the backend is down; A calls twice")
	a.call(ctx, llmretry.Policy{})
	a.call(ctx, llmretry.Policy{})
	a.state()

	fmt.Fprintln(w, "\n2. B calls: its breaker reads what A's wrote")
	b.call(ctx, llmretry.Policy{})
	b.state()

	fmt.Fprintln(w, "\n3. the backend is back; B calls, willing to wait out the cooldown")
	srv.Script(model, llmretrytest.Answer("ok"))
	if err := b.call(ctx, llmretry.Policy{Waits: []time.Duration{time.Second}}); err != nil {
		return fmt.Errorf("worker B's probe: %w", err)
	}
	b.state()

	fmt.Fprintln(w, "\n4. A calls")
	if err := a.call(ctx, llmretry.Policy{}); err != nil {
		return fmt.Errorf("worker A's last call: %w", err)
	}
	a.state()
	fmt.Fprintf(w, "\nthe server saw %d requests: A's two failures, B's probe and A's last call\n", len(srv.Requests()))
	if n := len(srv.Requests()); n != 4 {
		return fmt.Errorf("the server saw %d requests, want 4", n)
	}
	for _, x := range []*worker{a, b} {
		if st := x.b.State(); st.StoreErrors > 0 {
			return fmt.Errorf("worker %s: %d store calls failed, the last: %v", x.name, st.StoreErrors, st.StoreErr)
		}
	}
	return nil
}

// openStore opens the shared store: PostgreSQL at dbURL, or in memory
// when dbURL is empty. It returns the store, what it is for the output,
// and what closes it.
func openStore(ctx context.Context, dbURL string) (llmretry.BreakerStore, string, func(), error) {
	if dbURL == "" {
		return &llmretrytest.MemoryStore{}, "in memory (set DATABASE_URL for PostgreSQL)", func() {}, nil
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, "", nil, err
	}
	if err := pgbreaker.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, "", nil, err
	}
	s := pgbreaker.New(pool)
	return s, "PostgreSQL", func() { s.Close(); pool.Close() }, nil
}

// worker stands for one process: a Breaker of its own on the shared
// store, and a chain on the backend.
type worker struct {
	name string
	b    *llmretry.Breaker
	call func(ctx context.Context, p llmretry.Policy) error
	out  io.Writer
}

func newWorker(name string, store llmretry.BreakerStore, key string, srv *llmretrytest.Server, out io.Writer) *worker {
	x := &worker{
		name: name,
		// A short cooldown keeps the demo short; StoreTimeout is
		// generous for a database on a busy laptop.
		b:   &llmretry.Breaker{Store: store, Key: key, Failures: 2, Cooldown: 300 * time.Millisecond, StoreTimeout: 500 * time.Millisecond},
		out: out,
	}
	x.call = func(ctx context.Context, p llmretry.Policy) error {
		c := &llmretry.Chain[string, string]{
			Backends: []llmretry.Backend[string, string]{{Model: model, Call: send(srv), Retry: p, Breaker: x.b}},
			OnAttempt: func(_ context.Context, a llmretry.Attempt) {
				fmt.Fprintf(out, "   %s: %s\n", name, describe(a))
			},
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.Do(ctx, "hi")
		return err
	}
	return x
}

// state prints what the worker's breaker shows: the fleet's state as
// of its last decision.
func (x *worker) state() {
	st := x.b.State()
	fmt.Fprintf(x.out, "   %s's breaker: open %v, failures %d, opened %d times\n", x.name, st.Open, st.Failures, st.Opened)
}

// describe is an attempt in a few words, without its times, which vary.
func describe(a llmretry.Attempt) string {
	switch {
	case a.Skipped && a.Next == llmretry.NextRetry:
		return "skipped while the breaker was open, waited for it"
	case a.Skipped:
		return "skipped without sending: the breaker is open (" + string(a.Why) + ")"
	case a.Err == nil:
		return "sent, answered"
	}
	return "sent, failed with " + strconv.Itoa(a.Status)
}

// send is a Call to srv's model, in plain net/http.
func send(srv *llmretrytest.Server) func(context.Context, string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.OpenAIBaseURL()+"chat/completions",
			strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		return string(body), nil
	}
}
