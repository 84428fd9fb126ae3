package temporalretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/temporalretry"
)

// runItem runs chain c as activity "item" of a workflow, whose activity
// options have retry policy p, and returns what the workflow got: the
// answer or the error, and the workflow time the activity took.
func runItem(t *testing.T, c *chain, p *temporal.RetryPolicy) (answer string, took time.Duration, err error) {
	t.Helper()
	item := func(ctx context.Context) (string, error) { return temporalretry.Do(ctx, c, "hi") }
	wf := func(ctx workflow.Context) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 5 * time.Minute, RetryPolicy: p})
		start := workflow.Now(ctx)
		var answer string
		err := workflow.ExecuteActivity(ctx, "item").Get(ctx, &answer)
		return fmt.Sprintf("%s after %v", answer, workflow.Now(ctx).Sub(start)), err
	}
	env := workflowEnv(t, nil)
	env.RegisterActivityWithOptions(item, activity.RegisterOptions{Name: "item"})
	env.RegisterWorkflow(wf)
	env.ExecuteWorkflow(wf)
	if err := env.GetWorkflowError(); err != nil {
		return "", 0, err
	}
	var got string
	if err := env.GetWorkflowResult(&got); err != nil {
		t.Fatalf("GetWorkflowResult() = %v", err)
	}
	var d string
	if _, err := fmt.Sscanf(got, "%s after %s", &answer, &d); err != nil {
		t.Fatalf("workflow result %q: %v", got, err)
	}
	took, perr := time.ParseDuration(d)
	if perr != nil {
		t.Fatalf("workflow result %q: %v", got, perr)
	}
	return answer, took, nil
}

// Temporal's retries follow the advice: a transient failure is retried
// by the retry policy, a truncation never, and a retry-after is the next
// run's delay.
func TestTemporalRetries(t *testing.T) {
	policy := &temporal.RetryPolicy{InitialInterval: s, BackoffCoefficient: 1, MaximumAttempts: 4}
	tests := []struct {
		name      string
		steps     []step
		wantCalls int
		wantType  string // the ApplicationError's type; "" for success
		wantTook  time.Duration
	}{
		{name: "transient", steps: []step{status(503, ""), status(503, ""), answer("ok")}, wantCalls: 3, wantTook: 2 * s},
		{name: "truncated", steps: []step{fail(llmretry.Truncation("The answer")), answer("ok")}, wantCalls: 1, wantType: temporalretry.TypeTruncated},
		{name: "retry_after", steps: []step{status(429, "30"), answer("ok")}, wantCalls: 2, wantTook: 30 * s},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFake(tc.steps...)
				answer, took, err := runItem(t, &chain{Backends: []backend{{Model: "a", Call: f.call}}}, policy)
				if n := len(f.calls()); n != tc.wantCalls {
					t.Errorf("backend called %d times, want %d", n, tc.wantCalls)
				}
				if tc.wantType != "" {
					var app *temporal.ApplicationError
					if !errors.As(err, &app) || app.Type() != tc.wantType {
						t.Fatalf("workflow error = %v, want an ApplicationError of type %s", err, tc.wantType)
					}
					return
				}
				if err != nil || answer != "ok" {
					t.Fatalf("workflow = %q, %v; want ok", answer, err)
				}
				if took != tc.wantTook {
					t.Errorf("the activity took %v of workflow time, want %v", took, tc.wantTook)
				}
			})
		})
	}
}

// The runs before the last travel in its failure's details: the first
// and the latest, each the chain's record of that run.
func TestEarlierRunsInTheFailure(t *testing.T) {
	tests := []struct {
		name        string
		failures    int   // runs that fail with a 503 before one that truncates
		wantEarlier []int // the failed runs whose records are kept
		wantOmitted int
	}{
		{name: "two", failures: 2, wantEarlier: []int{1, 2}},
		{name: "past_the_bound", failures: 6, wantEarlier: []int{1, 4, 5, 6}, wantOmitted: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var steps []step
				for i := range tc.failures {
					steps = append(steps, fail(llmretry.StatusFailure(503, nil, fmt.Errorf("busy in run %d", i+1))))
				}
				f := newFake(append(steps, fail(llmretry.Truncation("The answer")))...)
				_, _, err := runItem(t, &chain{Backends: []backend{{Model: "a", Call: f.call}}}, &temporal.RetryPolicy{MaximumAttempts: 10})
				runs := failureRuns(t, err)
				if runs.Run != tc.failures+1 || runs.Omitted != tc.wantOmitted {
					t.Errorf("runs = run %d, omitted %d; want run %d, omitted %d", runs.Run, runs.Omitted, tc.failures+1, tc.wantOmitted)
				}
				var got []int
				for _, e := range runs.Earlier {
					rec := decodeRecord(t, e)
					if rec.Outcome != "exhausted" || len(rec.Attempts) != 1 {
						t.Fatalf("earlier record %s, want exhausted with one attempt", e)
					}
					var run int
					fmt.Sscanf(rec.Attempts[0].Err.Error(), "http 503: busy in run %d", &run)
					got = append(got, run)
				}
				if diff := cmp.Diff(tc.wantEarlier, got); diff != "" {
					t.Errorf("runs kept (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// failureRuns returns the runs that the activity's failure carries.
func failureRuns(t *testing.T, err error) temporalretry.Runs {
	t.Helper()
	var app *temporal.ApplicationError
	if !errors.As(err, &app) {
		t.Fatalf("workflow error = %v, want an ApplicationError", err)
	}
	var (
		raw  json.RawMessage
		runs temporalretry.Runs
	)
	if err := app.Details(&raw, &runs); err != nil {
		t.Fatalf("Details() = %v", err)
	}
	return runs
}

// A run that ends without a word (here: a backend that panics) leaves its
// records in its heartbeats: the next run carries them over, with the
// request it left in flight recorded as a timeout nobody saw end, so that
// every request the backend got is in the records.
func TestLostRequestIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(status(503, ""), die, fail(llmretry.Truncation("The answer")))
		c := &chain{Backends: []backend{{Model: "a", Call: f.call, Retry: llmretry.Policy{Waits: []time.Duration{s}}}}}
		_, _, err := runItem(t, c, &temporal.RetryPolicy{MaximumAttempts: 3})
		runs := failureRuns(t, err)
		if runs.Run != 2 || len(runs.Earlier) != 1 {
			t.Fatalf("runs = %+v, want run 2 with one earlier run", runs)
		}
		rec := decodeRecord(t, runs.Earlier[0])
		if rec.Outcome != "timed_out" || len(rec.Attempts) != 2 {
			t.Fatalf("the dead run's record = %+v, want timed_out with 2 attempts", rec)
		}
		lost := rec.Attempts[1]
		if lost.Kind != llmretry.KindTimeout || lost.Try != 2 || lost.Next != llmretry.NextStop || lost.Why != llmretry.WhyDeadline ||
			lost.Err == nil || lost.Err.Error() != "temporalretry: no answer seen: the activity attempt ended without a word (heartbeat timeout, start-to-close timeout or the worker's death) while this request was in flight" {
			t.Errorf("the request in flight = %+v, want try 2, a timeout nobody saw end", lost)
		}
		if first := rec.Attempts[0]; first.Status != 503 || first.Next != llmretry.NextRetry {
			t.Errorf("the dead run's first attempt = %+v, want the 503, retried", first)
		}
		// Every request the backend got is one attempt in the records:
		// two of the dead run, one of the last.
		if n := len(f.calls()); n != 3 {
			t.Errorf("backend called %d times, want 3", n)
		}
	})
}

// A run that died while its chain waited on a provider's retry-after
// (here: a hook that panics as the wait begins) is followed by one that
// waits out the rest of it before it sends.
func TestNextRunWaitsOutTheRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(status(429, "30"), answer("ok"))
		c := &chain{Backends: []backend{{Model: "a", Call: f.call, Retry: llmretry.Policy{Waits: []time.Duration{s}, MaxWait: time.Minute}}}}
		died := false
		c.OnAttempt = func(_ context.Context, a llmretry.Attempt) {
			if a.Next == llmretry.NextRetry && !died {
				died = true
				panic("the worker died during the wait")
			}
		}
		answer, _, err := runItem(t, c, &temporal.RetryPolicy{InitialInterval: s, MaximumAttempts: 2})
		if err != nil || answer != "ok" {
			t.Fatalf("workflow = %q, %v; want ok", answer, err)
		}
		calls := f.calls()
		if len(calls) != 2 {
			t.Fatalf("backend called %d times, want 2", len(calls))
		}
		if gap := calls[1].Sub(calls[0]); gap != 30*s {
			t.Errorf("the next request came %v after the 429, want the 30s it asked for", gap)
		}
	})
}

// A run that succeeds after others failed reads their records with
// EarlierRuns; outside an activity it is the zero Runs.
func TestEarlierRunsAfterSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(status(503, ""), status(429, ""), answer("ok"))
		c := &chain{Backends: []backend{{Model: "a", Call: f.call}}}
		var got temporalretry.Runs
		item := func(ctx context.Context) (string, error) {
			answer, err := temporalretry.Do(ctx, c, "hi")
			if err == nil {
				got = temporalretry.EarlierRuns(ctx)
			}
			return answer, err
		}
		wf := func(ctx workflow.Context) error {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3}})
			return workflow.ExecuteActivity(ctx, "item").Get(ctx, nil)
		}
		env := workflowEnv(t, nil)
		env.RegisterActivityWithOptions(item, activity.RegisterOptions{Name: "item"})
		env.RegisterWorkflow(wf)
		env.ExecuteWorkflow(wf)
		if err := env.GetWorkflowError(); err != nil {
			t.Fatalf("workflow: %v", err)
		}
		var statuses []int
		for _, e := range got.Earlier {
			for _, a := range decodeRecord(t, e).Attempts {
				statuses = append(statuses, a.Status)
			}
		}
		if got.Run != 3 || got.Omitted != 0 {
			t.Errorf("EarlierRuns() = run %d, omitted %d; want run 3, omitted 0", got.Run, got.Omitted)
		}
		if diff := cmp.Diff([]int{503, 429}, statuses); diff != "" {
			t.Errorf("earlier runs' statuses (-want +got):\n%s", diff)
		}
	})
	if got := temporalretry.EarlierRuns(context.Background()); got.Run != 0 || len(got.Earlier) != 0 {
		t.Errorf("EarlierRuns(context.Background()) = %+v, want the zero Runs", got)
	}
}
