package temporalretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/contrib/temporalretry"
)

// The dead-letter path, as the package documentation shows it: a workflow
// runs each item's activity and hands the dead ones to a dead-letter
// activity, with the why values of batch and every run's records.
func TestDeadLetterPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chains := map[string]*chain{
			"ok":        {Backends: []backend{{Model: "a", Call: newFake(answer("fine")).call}}},
			"truncated": {Backends: []backend{{Model: "a", Call: newFake(fail(llmretry.Truncation("The answer"))).call}}},
			"dead":      {Backends: []backend{{Model: "a", Call: newFake(status(503, "")).call}}},
			// Silent for longer than the HeartbeatTimeout: the run times
			// out, and its heartbeats hold its records.
			"silent":    {Backends: []backend{{Model: "a", Call: newFake(silent(time.Hour)).call}}},
			"cancelled": {Backends: []backend{{Model: "a", Call: newFake(silent(time.Hour)).call}}},
		}
		items := slices.Sorted(maps.Keys(chains))
		summarize := func(ctx context.Context, id string) (string, error) {
			return temporalretry.Do(ctx, chains[id], "hi")
		}
		var (
			mu   sync.Mutex
			dead []temporalretry.DeadLetter
		)
		deadLetter := func(_ context.Context, dl temporalretry.DeadLetter) error {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, dl)
			return nil
		}
		wf := func(ctx workflow.Context) ([]string, error) {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
				StartToCloseTimeout: time.Minute,
				HeartbeatTimeout:    4 * s,
				RetryPolicy:         &temporal.RetryPolicy{InitialInterval: s, MaximumAttempts: 3},
			})
			var done []string
			for _, id := range items {
				actx := ctx
				if id == "cancelled" {
					var cancel workflow.CancelFunc
					actx, cancel = workflow.WithCancel(ctx)
					workflow.Go(ctx, func(ctx workflow.Context) {
						_ = workflow.Sleep(ctx, s)
						cancel()
					})
				}
				var answer string
				err := workflow.ExecuteActivity(actx, summarize, id).Get(ctx, &answer)
				if dl, ok := temporalretry.DeadLetterOf(id, err); ok {
					if err := workflow.ExecuteActivity(ctx, deadLetter, dl).Get(ctx, nil); err != nil {
						return nil, err
					}
					continue
				}
				if err == nil {
					done = append(done, id)
				} else if !temporal.IsCanceledError(err) {
					return nil, err
				}
			}
			return done, nil
		}
		env := workflowEnv(t, nil)
		env.RegisterActivity(summarize)
		env.RegisterActivity(deadLetter)
		env.RegisterWorkflow(wf)
		env.ExecuteWorkflow(wf)
		var done []string
		if err := env.GetWorkflowResult(&done); err != nil {
			t.Fatalf("workflow: %v", err)
		}
		if diff := cmp.Diff([]string{"ok"}, done); diff != "" {
			t.Errorf("items done (-want +got):\n%s", diff)
		}

		type summary struct {
			ID      string
			Why     batch.Why
			Runs    int
			Outcome string
			Kinds   []llmretry.Kind
			Earlier []string // the earlier runs' outcomes
		}
		var got []summary
		for _, dl := range dead {
			rec := decodeRecord(t, dl.Error)
			s := summary{ID: dl.ID, Why: dl.Why, Runs: dl.Runs, Outcome: rec.Outcome, Earlier: []string{}}
			for _, a := range rec.Attempts {
				s.Kinds = append(s.Kinds, a.Kind)
			}
			for _, e := range dl.Earlier {
				s.Earlier = append(s.Earlier, decodeRecord(t, e).Outcome)
			}
			if dl.Omitted != 0 {
				t.Errorf("%s: omitted %d, want 0", dl.ID, dl.Omitted)
			}
			got = append(got, s)
		}
		want := []summary{
			{ID: "dead", Why: batch.WhyRunsUsed, Runs: 3, Outcome: "exhausted", Kinds: []llmretry.Kind{llmretry.KindTransient}, Earlier: []string{"exhausted", "exhausted"}},
			// The SDK's test environment does not retry a timed-out
			// activity, so the silent item's first run is its last.
			{ID: "silent", Why: batch.WhyRunsUsed, Runs: 1, Outcome: "timed_out", Kinds: []llmretry.Kind{llmretry.KindTimeout}, Earlier: []string{}},
			{ID: "truncated", Why: batch.WhyNotRetryable, Runs: 1, Outcome: "truncated", Kinds: []llmretry.Kind{llmretry.KindTruncated}, Earlier: []string{}},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("dead letters (-want +got):\n%s", diff)
		}
	})
}

// A DeadLetter encodes with the keys of a batch dead letter.
func TestDeadLetterJSON(t *testing.T) {
	keys := func(v any) []string {
		t.Helper()
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("json.Marshal(%T) = %v", v, err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("decoding %s: %v", data, err)
		}
		return slices.Sorted(maps.Keys(m))
	}
	want := keys(batch.DeadLetter{ID: "x", Why: batch.WhyRunsUsed, Runs: 1})
	dl := temporalretry.DeadLetter{ID: "x", Why: batch.WhyRunsUsed, Runs: 1, Error: json.RawMessage(`{}`), Earlier: []json.RawMessage{}}
	if diff := cmp.Diff(want, keys(dl)); diff != "" {
		t.Errorf("keys (-batch +temporalretry):\n%s", diff)
	}
}

// Errors that are not an activity's failure make no dead letter.
func TestDeadLetterOfOther(t *testing.T) {
	for _, err := range []error{nil, errors.New("not an activity's"), temporal.NewCanceledError(), temporal.NewApplicationError("mine", "Mine")} {
		if dl, ok := temporalretry.DeadLetterOf("x", err); ok {
			t.Errorf("DeadLetterOf(%v) = %+v, true; want false", err, dl)
		}
	}
}
