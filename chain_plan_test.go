package llmretry_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// visit is one record, as much of it as says which backend the call went
// to, and why it went on.
type visit struct {
	Model   string
	Try     int
	Skipped bool
	Next    llmretry.Next
	Why     llmretry.Why
}

// Which skipped backends a call comes back to, as Backend.Breaker says: those
// after which every backend failed for a reason about the request, a
// backend whose retry was put off for its breaker among them; a failure
// for a backend's health rules out those skipped before it, not those
// after. The property test (TestChainMatchesModel) found the first case.
func TestComeBackAfterHealthFailure(t *testing.T) {
	// script answers with the statuses in turn, then with its name. A 503
	// carries a retry-after of hint seconds, which opens the breaker.
	script := func(name string, hint int, codes ...int) func(context.Context, string) (string, error) {
		sent := 0
		return func(context.Context, string) (string, error) {
			sent++
			if sent <= len(codes) {
				h := http.Header{}
				if codes[sent-1] == 503 {
					h.Set("Retry-After", strconv.Itoa(hint))
				}
				return "", llmretry.StatusFailure(codes[sent-1], h, nil)
			}
			return name, nil
		}
	}
	type backend = llmretry.Backend[string, string]
	tests := []struct {
		name     string
		backends func() []backend
		want     string  // the answer of the second call
		steps    []visit // its records
	}{{
		// c is skipped and only d's refusal follows it: come back to c,
		// though b, before c, failed for its health. a, skipped before
		// b's failure, is not come back to, though its breaker half-opens
		// first.
		name: "skipped_after_a_health_failure",
		backends: func() []backend {
			return []backend{
				{Model: "a", Call: script("a", 30, 503), Breaker: &llmretry.Breaker{}},
				{Model: "b", Call: script("b", 0, 400, 500)},
				{Model: "c", Call: script("c", 60, 503), Breaker: &llmretry.Breaker{}},
				{Model: "d", Call: script("d", 0, 400, 400)},
			}
		},
		want: "c",
		steps: []visit{
			{"a", 1, true, llmretry.NextFailOver, llmretry.WhyBreaker},
			{"b", 1, false, llmretry.NextFailOver, llmretry.WhyWaitsUsed},
			{"c", 1, true, llmretry.NextFailOver, llmretry.WhyBreaker},
			{"d", 1, false, llmretry.NextFailOver, llmretry.WhyNotRetryable},
			{"c", 1, true, llmretry.NextRetry, ""}, // waited out c's retry-after
			{"c", 1, false, "", ""},
		},
	}, {
		// b's retry is put off, since its breaker would still be open
		// when the wait ended: b failed for its health after a was
		// skipped, so the call comes back to b, as its second try, and
		// not to a. Its second wait, 10s, lets it wait for b's breaker.
		name: "retry_put_off_for_the_breaker",
		backends: func() []backend {
			return []backend{
				{Model: "a", Call: script("a", 60, 503), Breaker: &llmretry.Breaker{}},
				{Model: "b", Call: script("b", 0, 400, 500), Breaker: &llmretry.Breaker{Failures: 1, Cooldown: 10 * time.Second},
					Retry: llmretry.Policy{Waits: []time.Duration{time.Second, 10 * time.Second}}},
				{Model: "c", Call: script("c", 0, 400, 400)},
			}
		},
		want: "b",
		steps: []visit{
			{"a", 1, true, llmretry.NextFailOver, llmretry.WhyBreaker},
			{"b", 1, false, llmretry.NextFailOver, llmretry.WhyBreaker},
			{"c", 1, false, llmretry.NextFailOver, llmretry.WhyNotRetryable},
			{"b", 2, true, llmretry.NextRetry, ""}, // waited for b's breaker
			{"b", 2, false, "", ""},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var steps []visit
				chain := &llmretry.Chain[string, string]{
					Backends: tc.backends(),
					OnAttempt: func(_ context.Context, a llmretry.Attempt) {
						steps = append(steps, visit{a.Model, a.Try, a.Skipped, a.Next, a.Why})
					},
				}
				// The first call opens the breakers.
				if _, err := chain.Do(context.Background(), "req"); err == nil {
					t.Fatalf("first Do() = nil error, want every backend failed")
				}
				steps = nil
				got, err := chain.Do(context.Background(), "req")
				if got != tc.want || err != nil {
					t.Errorf("second Do() = %q, %v, want %q, nil", got, err, tc.want)
				}
				if diff := cmp.Diff(tc.steps, steps); diff != "" {
					t.Errorf("second Do()'s records (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// The backends skipped for their breakers are revisited once: skipped
// again on that pass, they are not revisited a third time, and the call
// stops when the last of them fails.
func TestRevisitHappensOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		trunc := llmretry.Truncation("partial")
		brA, brB := &llmretry.Breaker{}, &llmretry.Breaker{}
		// Both half-open at 30s; opened by retry-after hints, which the
		// last backend's wait may wait out.
		tripFor(t, brA, 30*sec)
		tripFor(t, brB, 30*sec)
		a := newDesk("a", takes(0))
		b := newDesk("b", takes(sec, trunc))
		c := newDesk("c", takes(0, trunc))
		rec := newRecorder()
		ch := &chain{
			Backends: []backend{
				{Model: "a", Call: a.Call, Breaker: brA},
				{Model: "b", Call: b.Call, Breaker: brB},
				{Model: "c", Call: c.Call},
			},
			OnAttempt: rec.OnAttempt,
		}
		time.Sleep(sec)
		_, err := ch.Do(context.Background(), "hi")
		var tr *llmretry.Truncated
		if !errors.As(err, &tr) {
			t.Fatalf("Do() error = %v (%T), want a *Truncated", err, err)
		}
		const fo, stop = llmretry.NextFailOver, llmretry.NextStop
		at1 := start.Add(sec)
		want := []llmretry.Attempt{
			skipRec(0, "a", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			skipRec(1, "b", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			{Backend: 2, Model: "c", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: at1, Next: fo, Why: llmretry.WhyNotRetryable},
			// The second pass: a is skipped again; b, the last, is waited
			// for, probed at 30s, and truncates too.
			skipRec(0, "a", 1, llmretry.KindTransient, at1, 29*sec, fo, llmretry.WhyBreaker),
			waitRec(1, "b", 1, llmretry.KindTransient, at1, 29*sec, 29*sec),
			{Backend: 1, Model: "b", Try: 1, Kind: llmretry.KindTruncated, Err: trunc, RawText: ptr("partial"), Start: start.Add(30 * sec), Elapsed: sec, Next: stop, Why: llmretry.WhyNotRetryable},
		}
		if diff := cmp.Diff(want, tr.Attempts, attemptOpts); diff != "" {
			t.Errorf("error's records (-want +got):\n%s", diff)
		}
		attempts, _ := rec.seen()
		if diff := cmp.Diff(want, attempts, attemptOpts); diff != "" {
			t.Errorf("OnAttempt records (-want +got):\n%s", diff)
		}
		if got := a.log(); got != nil {
			t.Errorf("requests to a = %v, want none: no third pass", got)
		}
		if diff := cmp.Diff([]sent{{30 * sec, "hi"}}, b.log()); diff != "" {
			t.Errorf("requests to b (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]sent{{sec, "hi"}}, c.log()); diff != "" {
			t.Errorf("requests to c (-want +got):\n%s", diff)
		}
	})
}
