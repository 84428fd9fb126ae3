package summarize_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/examples/temporal/summarize"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The workflow over ten items, in the SDK's test environment, against the
// scripted provider over real HTTP: each item ends as its behaviour says,
// and the dead ones reach the dead-letter activity with batch's why values.
func TestWorkflow(t *testing.T) {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	summarize.Script(srv, 10)

	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(time.Minute)
	var dead, runs bytes.Buffer
	summarize.Register(env, &summarize.Activities{Chain: summarize.NewChain(srv.OpenAIBaseURL()), Dead: &dead, Log: &runs})
	env.ExecuteWorkflow("summarize_items", summarize.Items(10))
	var sum summarize.Summary
	if err := env.GetWorkflowResult(&sum); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	checkSummary(t, sum)

	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(dead.String()), "\n") {
		var dl struct {
			ID  string    `json:"id"`
			Why batch.Why `json:"why"`
		}
		if err := json.Unmarshal([]byte(line), &dl); err != nil {
			t.Fatalf("dead letter line %q: %v", line, err)
		}
		lines = append(lines, dl.ID+" "+string(dl.Why))
	}
	slices.Sort(lines)
	want := []string{"item-3 not_retryable", "item-4 runs_used", "item-8 not_retryable", "item-9 runs_used"}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("dead-letter lines (-want +got):\n%s", diff)
	}
	if !strings.Contains(runs.String(), "item-2 run 1: Exhausted, next run in 3s") {
		t.Errorf("runs log:\n%s\nwant item-2's first run to give the provider's retry-after to Temporal", runs.String())
	}
}

// checkSummary checks what became of the ten items.
func checkSummary(t *testing.T, sum summarize.Summary) {
	t.Helper()
	done := slices.Sorted(maps.Keys(sum.Done))
	if diff := cmp.Diff([]string{"item-0", "item-1", "item-2", "item-5", "item-6", "item-7"}, done); diff != "" {
		t.Errorf("items done (-want +got):\n%s", diff)
	}
	for id, answer := range sum.Done {
		if want := "The summary of " + id + ", streamed word by word."; answer != want {
			t.Errorf("%s: answer %q, want %q", id, answer, want)
		}
	}
	type dead struct {
		ID   string
		Why  batch.Why
		Runs int
	}
	var got []dead
	for _, dl := range sum.Dead {
		got = append(got, dead{dl.ID, dl.Why, dl.Runs})
	}
	want := []dead{
		{"item-3", batch.WhyNotRetryable, 1},
		{"item-4", batch.WhyRunsUsed, 3},
		{"item-8", batch.WhyNotRetryable, 1},
		{"item-9", batch.WhyRunsUsed, 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
}
