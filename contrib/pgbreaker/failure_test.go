package pgbreaker_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

// answerer is a chain's Call to srv's model: plain net/http.
func answerer(srv *llmretrytest.Server) func(context.Context, string) (string, error) {
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
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		return string(b), nil
	}
}

// When the store fails, the chain does not: against a database that
// refuses connections, one that never answers, and a pool and listening
// connection closed between two rounds of calls, every call is answered
// (so it ended within its deadline, or Do would have returned TimedOut)
// with one request each, and the Breaker counts the store's failures in
// its state.
func TestStoreFailure(t *testing.T) {
	// Calls at once in each round: as many as the pool has connections
	// by default on this machine, so that none waits for one.
	const perRound = 4
	t.Parallel()
	hole := llmretrytest.NewBlackhole()
	t.Cleanup(hole.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()
	deadURL := func(addr string) string { return "postgres://u:p@" + addr + "/db?sslmode=disable" }
	tests := []struct {
		name string
		url  func(t *testing.T) string
		// closeMidway closes the pool after the first round: the store
		// works, then fails.
		closeMidway bool
	}{
		{"refuses", func(*testing.T) string { return deadURL(closedAddr) }, false},
		{"never_answers", func(*testing.T) string { return deadURL(strings.TrimPrefix(hole.URL, "http://")) }, false},
		{"pool_closed_midway", func(t *testing.T) string { return freshSchema(t, pgURL(t), "pgbreaker_failure") }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := tc.url(t)
			pool := newPool(t, url)
			if tc.closeMidway {
				if err := pgbreaker.Migrate(t.Context(), pool); err != nil {
					t.Fatalf("Migrate() = %v", err)
				}
				// Connections made before the round, as a process that
				// has been up a while has them: under -race on a busy
				// machine, making one can take longer than a decision
				// may.
				conns := make([]*pgxpool.Conn, 0, perRound)
				for range perRound {
					c, err := pool.Acquire(t.Context())
					if err != nil {
						t.Fatalf("Acquire() = %v", err)
					}
					conns = append(conns, c)
				}
				for _, c := range conns {
					c.Release()
				}
			}
			store := pgbreaker.New(pool)
			defer store.Close()
			srv := llmretrytest.NewServer()
			defer srv.Close()
			srv.Script(model, llmretrytest.Answer("ok"))
			// The default StoreTimeout bounds the calls to a database
			// that is down; one that works gets the fleet test's, for the
			// same reason (see fleetStoreTimeout).
			b := &llmretry.Breaker{Store: store, Key: testKey(t)}
			if tc.closeMidway {
				b.StoreTimeout = fleetStoreTimeout
			}
			c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{Model: model, Call: answerer(srv), Breaker: b}}}

			round := func(name string) {
				t.Helper()
				var wg sync.WaitGroup
				errs := make([]error, perRound)
				for i := range errs {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
						defer cancel()
						_, errs[i] = c.Do(ctx, "hi")
					})
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Errorf("%s: call %d: Do() = %v, want an answer", name, i, err)
					}
				}
			}
			if tc.closeMidway {
				round("before")
				if st := b.State(); st.StoreErrors != 0 || st.StoreUnavailable {
					t.Errorf("before: State() = StoreErrors %d, StoreUnavailable %v, last %v; want 0, false", st.StoreErrors, st.StoreUnavailable, st.StoreErr)
				}
				// The database gone, its notices with it: with the
				// listening connection up, the calls (to a backend that
				// reports no limits) would need no store call, their
				// breaker closed as the notices say.
				pool.Close()
				store.Close()
			}
			round("store down")
			st := b.State()
			if st.StoreErrors == 0 || !st.StoreUnavailable || st.StoreErr == nil {
				t.Errorf("State() = StoreErrors %d, StoreUnavailable %v, StoreErr %v; want failures counted", st.StoreErrors, st.StoreUnavailable, st.StoreErr)
			}
			rounds := 1
			if tc.closeMidway {
				rounds = 2
			}
			if got, want := len(srv.Requests()), rounds*perRound; got != want {
				t.Errorf("server log: %d requests, want %d: one per call", got, want)
			}
		})
	}
}

// With its pool closed and its listening connection up, every store
// call fails at once while the store's notices still come: each call is
// answered within its deadline, one whose failure must be written by its
// retry, and the Breaker counts the store's errors and keeps saying the
// store is unavailable, as no store call has answered since.
func TestStorePoolClosedListenerUp(t *testing.T) {
	t.Parallel()
	url := freshSchema(t, pgURL(t), "pgbreaker_pool_closed")
	pool := newPool(t, url)
	if err := pgbreaker.Migrate(t.Context(), pool); err != nil {
		t.Fatalf("Migrate() = %v", err)
	}
	store := pgbreaker.New(pool)
	defer store.Close()
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script(model, llmretrytest.Answer("ok"))
	b := &llmretry.Breaker{Store: store, Key: testKey(t), StoreTimeout: fleetStoreTimeout}
	c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
		Model: model, Call: answerer(srv), Breaker: b,
		Retry: llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond}, Reserve: -1},
	}}}
	do := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		if _, err := c.Do(ctx, "hi"); err != nil {
			t.Errorf("%s: Do() = %v, want an answer", what, err)
		}
	}
	do("before")
	if err := pgbreaker.Listening(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	do("pool closed")
	srv.Script(model, llmretrytest.Status(http.StatusServiceUnavailable), llmretrytest.Answer("ok"))
	do("pool closed, a 503 and its retry")
	if st := b.State(); st.StoreErrors == 0 || !st.StoreUnavailable || st.StoreErr == nil {
		t.Errorf("pool closed, a failure to write: State() = StoreErrors %d, StoreUnavailable %v, StoreErr %v; want it counted", st.StoreErrors, st.StoreUnavailable, st.StoreErr)
	}
	do("pool closed, after the failure")
	if st := b.State(); !st.StoreUnavailable {
		t.Errorf("pool closed, after the failure: State().StoreUnavailable = false, want true: no store call has answered since")
	}
	if got, want := len(srv.Requests()), 5; got != want {
		t.Errorf("server log: %d requests, want %d: one per call, and the retry", got, want)
	}
}
