package llmretry_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The tests in this file hold a Backend's Pool to its rules, in virtual
// time: which deployment each request goes to, and why.

// deployment is a pool's deployment named name, answering through d,
// with a Breaker of its own, in tier.
func deployment(name string, d *desk, tier int) llmretry.Deployment[string, string] {
	return llmretry.Deployment[string, string]{
		Name: name, Tier: tier,
		Backend: backend{Model: "gpt-4o", Call: d.Call, Breaker: &llmretry.Breaker{}},
	}
}

// reporting is a desk's call that reports limit requests, remaining
// left, full again in reset, on every answer.
func reporting(d *desk, limit, remaining int, reset time.Duration) func(context.Context, string) (string, error) {
	return func(ctx context.Context, req string) (string, error) {
		llmretry.ReportLimits(ctx, limitHeader(limit, remaining, reset))
		return d.Call(ctx, req)
	}
}

// where is each record's deployment, and why it was chosen.
func where(recs []llmretry.Attempt) []string {
	var out []string
	for _, a := range recs {
		s := a.Deployment + ":" + string(a.Chosen)
		if a.Err != nil || a.Skipped {
			s += ":" + a.Kind.String()
		}
		out = append(out, s)
	}
	return out
}

// A request goes to the deployment with the most headroom by its
// provider's freshest report: here b reports more requests left than a,
// so the next request goes to b, and the record says why.
func TestPoolChoosesByHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		pa.Backend.Call = reporting(da, 100, 10, time.Minute)
		pb.Backend.Call = reporting(db, 100, 60, time.Minute)
		var rec pacedRecorder
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}}}, OnAttempt: rec.on}
		for _, req := range []string{"first", "second", "third"} {
			if _, err := c.Do(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
		// Before any report both stand alike: the first in order. Then
		// a has 10% left and b (unknown) stands as full; then b 60%.
		want := []string{"a:order", "b:headroom", "b:headroom"}
		if diff := cmp.Diff(want, where(rec.recs)); diff != "" {
			t.Errorf("deployments (-want +got):\n%s", diff)
		}
	})
}

// A request goes to a higher tier only when no deployment of a lower one
// can take it now: here the provisioned deployment (tier 0) reports no
// request left, the next one 10 s away, so the request right after the
// first spills over to pay-as-you-go (tier 1), and the one after 10 s
// goes to provisioned again.
func TestPoolSpillsOverByTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dp, dg := newDesk("provisioned", takes(0)), newDesk("paygo", takes(0))
		pp, pg := deployment("provisioned", dp, 0), deployment("paygo", dg, 1)
		pp.Backend.Call = reporting(dp, 10, 0, 100*time.Second) // empty, one more every 10 s
		var rec pacedRecorder
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pg, pp}}}, OnAttempt: rec.on}
		for _, req := range []string{"first", "second", "", "third"} {
			if req == "" {
				time.Sleep(10 * sec)
				continue
			}
			if _, err := c.Do(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"provisioned:tier", "paygo:spill", "provisioned:tier"}
		if diff := cmp.Diff(want, where(rec.recs)); diff != "" {
			t.Errorf("deployments (-want +got):\n%s", diff)
		}
	})
}

// A failure about a deployment's health sends the request on to the
// next-best deployment at once, before the chain's next backend and
// before any of the policy's waits; the record says retry, at once.
func TestPoolFailsOverWithinThePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("overloaded"))
		da, db := newDesk("a", takes(100*ms, down)), newDesk("b", takes(100*ms))
		next := newDesk("next", takes(0))
		var rec pacedRecorder
		c := &chain{Backends: []backend{
			{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{deployment("a", da, 0), deployment("b", db, 0)},
				Retry: llmretry.Policy{Waits: []time.Duration{10 * sec}}},
			{Model: "other", Call: next.Call},
		}, OnAttempt: rec.on}
		got, err := c.Do(t.Context(), "r")
		if err != nil || got != "b: r" {
			t.Fatalf("Do() = %q, %v, want b's answer", got, err)
		}
		if diff := cmp.Diff([]string{"a:order:transient", "b:only"}, where(rec.recs)); diff != "" {
			t.Errorf("deployments (-want +got):\n%s", diff)
		}
		if a := rec.recs[0]; a.Next != llmretry.NextRetry || a.RetryIn != 0 {
			t.Errorf("first record: Next %q, RetryIn %v; want retry at once", a.Next, a.RetryIn)
		}
		if diff := cmp.Diff([]sent{{100 * ms, "r"}}, db.log()); diff != "" {
			t.Errorf("requests to b (-want +got):\n%s", diff)
		}
		if next.log() != nil {
			t.Errorf("the chain's next backend got %v, want nothing", next.log())
		}
	})
}

// When every deployment failed, the call waits by its policy, then goes
// to whichever deployment is best when the wait ends: its place in the
// line of the one it waited for is given up, not carried to another.
func TestPoolRetriesAfterAWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("overloaded"))
		da, db := newDesk("a", takes(0, down)), newDesk("b", takes(0, down))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb},
			Retry: llmretry.Policy{Waits: []time.Duration{sec}}}}}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		start := time.Now()
		got, err := c.Do(ctx, "r")
		if err != nil || time.Since(start) != sec {
			t.Fatalf("Do() = %q, %v after %v; want an answer after 1s", got, err, time.Since(start))
		}
		for _, d := range []llmretry.Deployment[string, string]{pa, pb} {
			if s := d.Backend.Breaker.State(); s.LetThrough != 0 {
				t.Errorf("%s: %d requests in flight after the call, want 0", d.Name, s.LetThrough)
			}
		}
	})
}

// A failure about the request is not retried across the pool: another
// deployment would answer it the same way.
func TestPoolDoesNotRetryTheRequestsFault(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"rejected", llmretry.StatusFailure(http.StatusBadRequest, nil, errors.New("bad request"))},
		{"truncated", llmretry.Truncation("cut")},
		{"refused", llmretry.Refusal("content_filter")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				da, db := newDesk("a", takes(0, tc.err)), newDesk("b", takes(0))
				c := &chain{Backends: []backend{{Model: "gpt-4o",
					Pool: []llmretry.Deployment[string, string]{deployment("a", da, 0), deployment("b", db, 0)}}}}
				if _, err := c.Do(t.Context(), "r"); err == nil {
					t.Fatal("Do() = nil error, want the request's failure")
				}
				if db.log() != nil {
					t.Errorf("b got %v, want nothing: the failure was the request's", db.log())
				}
			})
		})
	}
}

// Without reports to tell them apart, concurrent requests go to the
// deployment with the fewest in flight for its weight: 30 at once over a
// of weight 2 and b of weight 1 give a 20 and b 10.
func TestPoolSpreadsByWeight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(sec)), newDesk("b", takes(sec))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		pa.Weight = 2
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}}}}
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() { c.Do(t.Context(), "r") })
			synctest.Wait() // one at a time, each seeing the others in flight
		}
		wg.Wait()
		if a, b := len(da.log()), len(db.log()); a != 20 || b != 10 {
			t.Errorf("requests: a %d, b %d; want 20 and 10", a, b)
		}
	})
}

// A pool with no deployment able to take the request now is skipped like
// a backend whose breaker is open, and its record names the deployment
// that holds the request back.
func TestPoolSkippedWhenNoDeploymentCanTakeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		tripFor(t, pa.Backend.Breaker, 30*sec)
		tripFor(t, pb.Backend.Breaker, 20*sec)
		next := newDesk("next", takes(0))
		var rec pacedRecorder
		c := &chain{Backends: []backend{
			{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}},
			{Model: "other", Call: next.Call},
		}, OnAttempt: rec.on}
		if got, err := c.Do(t.Context(), "r"); err != nil || got != "next: r" {
			t.Fatalf("Do() = %q, %v, want the next backend's answer", got, err)
		}
		if got := rec.recs[0]; !got.Skipped || got.Deployment != "b" || got.Next != llmretry.NextFailOver {
			t.Errorf("first record = %+v, want a skip naming b (open the shortest), failing over", got)
		}
	})
}

// A pool is set up right or not at all.
func TestPoolValidate(t *testing.T) {
	d := newDesk("a", takes(0))
	ok := func() llmretry.Deployment[string, string] { return deployment("a", d, 0) }
	tests := []struct {
		name string
		b    backend
		want string
	}{
		{"no_name", backend{Pool: []llmretry.Deployment[string, string]{{Backend: backend{Call: d.Call, Breaker: &llmretry.Breaker{}}}}}, "deployment 0 has no name"},
		{"same_name", backend{Pool: []llmretry.Deployment[string, string]{ok(), ok()}}, "deployment 1 (a): another deployment has the same name"},
		{"no_breaker", backend{Pool: []llmretry.Deployment[string, string]{{Name: "a", Backend: backend{Call: d.Call}}}}, "deployment 0 (a): breaker is nil"},
		{"own_call", backend{Call: d.Call, Pool: []llmretry.Deployment[string, string]{ok()}}, "a pool's backend has no call or breaker of its own"},
		{"pool_in_pool", backend{Pool: []llmretry.Deployment[string, string]{{Name: "inner", Backend: backend{Call: d.Call, Breaker: &llmretry.Breaker{}, Pool: []llmretry.Deployment[string, string]{ok()}}}}}, "deployment 0 (inner): has a pool of its own"},
		{"negative_tier", backend{Pool: []llmretry.Deployment[string, string]{{Name: "a", Tier: -1, Backend: backend{Call: d.Call, Breaker: &llmretry.Breaker{}}}}}, "tier or weight is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &chain{Backends: []backend{tc.b}}
			err := c.Validate()
			if !errors.Is(err, llmretry.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an ErrConfig saying %q", err, tc.want)
			}
		})
	}
}

// A backend's Estimate is charged against the provider's tokens bucket
// from the moment a request is let through, and settled by the next
// report: here the report after a warm-up says 2,000 tokens are left of
// 10,000, each request is estimated at 600 (100 in, a budget of 500 out)
// but uses 100. Of a burst of ten, three fit and go to the primary, the
// rest to the fallback; once their reports come back (1,700 left), the
// estimates of requests sent before them no longer count, and two of the
// next burst of ten fit.
func TestEstimateChargedUpFrontAndSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu   sync.Mutex
			left = int64(2100) // before the warm-up's 100
		)
		primary := newDesk("primary", takes(100*ms))
		call := func(ctx context.Context, req string) (string, error) {
			mu.Lock()
			left -= 100
			h := limitHeader(1000, 900, time.Minute)
			h.Set("X-Ratelimit-Limit-Tokens", "10000")
			h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(left, 10))
			h.Set("X-Ratelimit-Reset-Tokens", "10m0s") // refills too slowly to matter here
			mu.Unlock()
			llmretry.ReportLimits(ctx, h)
			llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: 80, OutputTokens: 20})
			return primary.Call(ctx, req)
		}
		fallback := newDesk("fallback", takes(100*ms))
		c := &chain{Backends: []backend{
			{Model: "primary", Call: call, Breaker: &llmretry.Breaker{},
				Estimate: func(string) llmretry.Usage { return llmretry.Usage{InputTokens: 100, OutputTokens: 500} }},
			{Model: "fallback", Call: fallback.Call},
		}}
		if _, err := c.Do(t.Context(), "warm"); err != nil {
			t.Fatal(err)
		}
		burst := func(name string) int {
			before := len(primary.log())
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() { c.Do(t.Context(), name) })
			}
			wg.Wait()
			return len(primary.log()) - before
		}
		if got := burst("first"); got != 3 {
			t.Errorf("first burst: %d of 10 to the primary, want 3 (2,000 tokens left, 600 estimated each)", got)
		}
		time.Sleep(sec)
		if got := burst("second"); got != 2 {
			t.Errorf("second burst: %d of 10 to the primary, want 2 (1,700 left once the reports settled the estimates)", got)
		}
	})
}

// reportsInTurn is a desk's call that reports, on its n-th answer (from 1),
// the requests bucket reports[min(n, len(reports))-1] says.
func reportsInTurn(d *desk, reports ...http.Header) func(context.Context, string) (string, error) {
	var (
		mu sync.Mutex
		n  int
	)
	return func(ctx context.Context, req string) (string, error) {
		mu.Lock()
		n++
		h := reports[min(n, len(reports))-1]
		mu.Unlock()
		llmretry.ReportLimits(ctx, h)
		return d.Call(ctx, req)
	}
}

// Calls that no deployment can take now wait where they will be let
// through soonest, counting a pace of the provider's for each call
// already waiting: with a and b both out of requests until the same
// moment, four waiting calls go a, b, a, b, not all to the first in
// order, and every record of them names its deployment and says
// "soonest".
func TestPoolWaitingCallsSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		// No request left, one more each second.
		pa.Backend.Call = reporting(da, 10, 0, 10*sec)
		pb.Backend.Call = reporting(db, 10, 0, 10*sec)
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb},
			Retry: llmretry.Policy{Waits: []time.Duration{sec}}}}}
		for _, req := range []string{"warm-a", "warm-b"} {
			if _, err := c.Do(t.Context(), req); err != nil {
				t.Fatal(err)
			}
		}
		recs := make([]pacedRecorder, 4)
		var wg sync.WaitGroup
		for i := range recs {
			cc := *c
			cc.OnAttempt = recs[i].on
			wg.Go(func() {
				if _, err := cc.Do(t.Context(), "w"+strconv.Itoa(i)); err != nil {
					t.Errorf("call %d: %v", i, err)
				}
			})
			synctest.Wait() // one at a time, each seeing the others in line
		}
		wg.Wait()
		for i, want := range []string{"a", "b", "a", "b"} {
			w := where(recs[i].recs)
			if diff := cmp.Diff([]string{want + ":soonest:transient", want + ":soonest"}, w); diff != "" {
				t.Errorf("call %d: records (-want +got):\n%s", i, diff)
			}
		}
	})
}

// A deployment the fleet has found closed, while this process still
// reads it as open, holds back the request chosen for it: the request
// goes on at once to the pool's next-best deployment instead of waiting
// for it (paced, when it is the only deployment that could have taken
// it, the call would wait) or stopping (open, when no wait would see it
// half-open). The skip's record says retry, at once, and the request sent
// next keeps its Try.
func TestPoolStaleChoiceGoesOn(t *testing.T) {
	paced := limitHeader(10, 0, 100*sec) // none left, the next in 10 s
	tests := []struct {
		name string
		// close makes the fleet close deployment a, through a Breaker of
		// another process (br) that calls a through call.
		close func(t *testing.T, br *llmretry.Breaker, call func(context.Context, string) (string, error))
		want  []string // the records of this process's call after the fleet closed a
	}{{
		name: "paced",
		close: func(t *testing.T, br *llmretry.Breaker, call func(context.Context, string) (string, error)) {
			c := &chain{Backends: []backend{{Model: "a", Call: call, Breaker: br}}}
			if _, err := c.Do(t.Context(), "other"); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"a:headroom:transient", "b:only"},
	}, {
		name: "open",
		close: func(t *testing.T, br *llmretry.Breaker, _ func(context.Context, string) (string, error)) {
			trip(t, br, llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("down")))
		},
		want: []string{"a:headroom:transient", "b:only"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &llmretrytest.MemoryStore{Latency: 2 * ms}
				da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
				// a reports half its requests left, then none; b 30%.
				callA := reportsInTurn(da, limitHeader(10, 5, 50*sec), paced)
				pa := llmretry.Deployment[string, string]{Name: "a", Backend: backend{Model: "gpt-4o", Call: callA,
					Breaker: &llmretry.Breaker{Store: store, Key: "a", Failures: 1}}}
				pb := deployment("b", db, 0)
				pb.Backend.Call = reporting(db, 10, 3, 70*sec)
				var rec pacedRecorder
				c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}}}, OnAttempt: rec.on}
				for _, req := range []string{"one", "two"} {
					if _, err := c.Do(t.Context(), req); err != nil {
						t.Fatal(err)
					}
				}
				if diff := cmp.Diff([]string{"a:order", "b:headroom"}, where(rec.recs)); diff != "" {
					t.Fatalf("warm-up records (-want +got):\n%s", diff)
				}
				tc.close(t, &llmretry.Breaker{Store: store, Key: "a", Failures: 1}, callA)
				rec.recs = nil
				start := time.Now()
				got, err := c.Do(t.Context(), "three")
				if err != nil || got != "b: three" || time.Since(start) > 10*ms {
					t.Fatalf("Do() = %q, %v after %v, want b's answer at once", got, err, time.Since(start))
				}
				if diff := cmp.Diff(tc.want, where(rec.recs)); diff != "" {
					t.Errorf("records (-want +got):\n%s", diff)
				}
				if s := rec.recs[0]; s.Next != llmretry.NextRetry || s.RetryIn != 0 || s.Try != 1 || rec.recs[1].Try != 1 {
					t.Errorf("records = %+v, want a skip retrying at once, then try 1", rec.recs)
				}
			})
		})
	}
}

// When the deployment that may take the request soonest will not be
// waited for (its breaker, opened by failures, half-opens after the
// policy's waits would have ended), the call waits for the next soonest
// instead of stopping: here b, whose provider admits the next request in
// 3 s, a pace the call may wait for.
func TestPoolWaitsForTheNextSoonest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		pa.Backend.Breaker.Failures, pa.Backend.Breaker.Cooldown = 1, 2*sec
		pb.Backend.Call = reporting(db, 10, 0, 30*sec) // none left, the next in 3 s
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb},
			Retry: llmretry.Policy{Waits: []time.Duration{sec}}}}}
		trip(t, pa.Backend.Breaker, llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("down")))
		if got, err := c.Do(t.Context(), "warm"); err != nil || got != "b: warm" {
			t.Fatalf("warm-up: Do() = %q, %v, want b's answer", got, err)
		}
		var rec pacedRecorder
		c.OnAttempt = rec.on
		start := time.Now()
		got, err := c.Do(t.Context(), "r")
		if err != nil || got != "b: r" || time.Since(start) != 3*sec {
			t.Fatalf("Do() = %q, %v after %v, want b's answer after 3s", got, err, time.Since(start))
		}
		want := []string{"a:soonest:transient", "b:soonest:transient", "b:soonest"}
		if diff := cmp.Diff(want, where(rec.recs)); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
	})
}

// Each deployment's Estimate runs once a call, the one chosen included:
// it may read the whole request.
func TestPoolEstimatesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		da, db := newDesk("a", takes(0)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		var mu sync.Mutex
		runs := map[string]int{}
		count := func(name string) func(string) llmretry.Usage {
			return func(string) llmretry.Usage {
				mu.Lock()
				defer mu.Unlock()
				runs[name]++
				return llmretry.Usage{InputTokens: 100, OutputTokens: 100}
			}
		}
		pa.Backend.Estimate, pb.Backend.Estimate = count("a"), count("b")
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb}}}}
		if _, err := c.Do(t.Context(), "r"); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]int{"a": 1, "b": 1}, runs); diff != "" {
			t.Errorf("Estimate runs (-want +got):\n%s", diff)
		}
	})
}

// A pool is one backend: a call that waits for one deployment and then,
// that wait in vain, for the next, waits no longer than MaxWait in all.
// Here each deployment has none left of its provider's requests and one
// long request in flight, so each holds calls until an answer comes.
func TestPoolMaxWaitBoundsEveryDeployment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := func(n int) (time.Duration, error) {
			if n == 2 {
				return time.Minute, nil
			}
			return 0, nil
		}
		da, db := newDesk("a", long), newDesk("b", long)
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		pa.Backend.Call = reporting(da, 10, 0, 30*sec) // none left, the next in 3s
		pb.Backend.Call = reporting(db, 10, 0, 30*sec)
		var wg sync.WaitGroup
		for _, d := range []llmretry.Deployment[string, string]{pa, pb} {
			one := &chain{Backends: []backend{d.Backend}}
			if _, err := one.Do(t.Context(), "warm"); err != nil {
				t.Fatalf("warm-up of %s: %v", d.Name, err)
			}
			wg.Go(func() {
				time.Sleep(3 * sec) // once the next is admitted
				if _, err := one.Do(t.Context(), "long"); err != nil {
					t.Errorf("long request to %s: %v", d.Name, err)
				}
			})
		}
		time.Sleep(4 * sec)
		var rec pacedRecorder
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb},
			Retry: llmretry.Policy{Waits: []time.Duration{sec}, MaxWait: sec}}}, OnAttempt: rec.on}
		start := time.Now()
		_, err := c.Do(t.Context(), "r")
		if err == nil || time.Since(start) != sec {
			t.Errorf("Do() = %v after %v, want an error after MaxWait, 1s", err, time.Since(start))
		}
		want := []string{"a:soonest:transient", "b:soonest:transient"}
		if diff := cmp.Diff(want, where(rec.recs)); diff != "" {
			t.Errorf("records (-want +got):\n%s", diff)
		}
		wg.Wait()
	})
}

// A request sent between two waits starts the bound anew: the call that
// waited for a from 0 s sent to it at 2 s, and that request failing at
// 7 s goes on to b, which another caller's failure has just opened for
// 1 s; the call waits that second, MaxWait counted from 7 s, not from
// its first wait.
func TestPoolWaitAfterASendHasItsOwnBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("down"))
		da, db := newDesk("a", takes(5*sec, down)), newDesk("b", takes(0))
		pa, pb := deployment("a", da, 0), deployment("b", db, 0)
		pa.Backend.Breaker.Failures, pa.Backend.Breaker.Cooldown = 1, 2*sec
		pb.Backend.Breaker.Failures, pb.Backend.Breaker.Cooldown = 1, 5*sec
		trip(t, pa.Backend.Breaker, down)
		trip(t, pb.Backend.Breaker, down)
		c := &chain{Backends: []backend{{Model: "gpt-4o", Pool: []llmretry.Deployment[string, string]{pa, pb},
			Retry: llmretry.Policy{Waits: []time.Duration{30 * sec}, MaxWait: 3 * sec}}}}
		c.OnAttempt = func(_ context.Context, a llmretry.Attempt) {
			if a.Deployment == "a" && a.Err != nil {
				trip(t, pb.Backend.Breaker, limited(1)) // b's probe, another caller's: open again for 1 s
			}
		}
		start := time.Now()
		got, err := c.Do(t.Context(), "r")
		if err != nil || got != "b: r" || time.Since(start) != 8*sec {
			t.Fatalf("Do() = %q, %v after %v, want b's answer after 8s", got, err, time.Since(start))
		}
	})
}
