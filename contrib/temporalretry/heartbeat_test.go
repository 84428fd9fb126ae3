package temporalretry_test

import (
	"context"
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

const s = time.Second

// When a run heartbeats, with an activity that has no HeartbeatTimeout
// (every DefaultHeartbeatEvery, 10s): at its start, before each request,
// after each failed attempt, while the chain waits, and while a stream
// makes progress; never while a request in flight is silent.
func TestHeartbeats(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		waits []time.Duration
		want  []time.Duration // when each heartbeat was recorded, from the run's start
	}{
		{
			// The run's start, the request's, then progress every 10s of
			// a minute-long stream.
			name:  "stream",
			steps: []step{stream(60, s)},
			want:  []time.Duration{0, 0, 10 * s, 20 * s, 30 * s, 40 * s, 50 * s, 60 * s},
		},
		{
			// A request that says nothing for a minute: nothing between
			// its start and its answer.
			name:  "silent",
			steps: []step{silent(60 * s)},
			want:  []time.Duration{0, 0},
		},
		{
			// A 503, then a 45s wait: the attempt's end, a tick every 10s
			// of the wait, and the retry's start.
			name:  "wait",
			steps: []step{status(503, ""), answer("ok")},
			waits: []time.Duration{45 * s},
			want:  []time.Duration{0, 0, 0, 10 * s, 20 * s, 30 * s, 40 * s, 45 * s},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake(tc.steps...).call, Retry: llmretry.Policy{Waits: tc.waits}}}}
				var t0 time.Time
				run := func(ctx context.Context) (string, error) {
					t0 = time.Now()
					return temporalretry.Do(ctx, c, "hi")
				}
				b := &beats{}
				env := activityEnv(t, b)
				env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
				if _, err := env.ExecuteActivity("run"); err != nil {
					t.Fatalf("ExecuteActivity() = %v", err)
				}
				if diff := cmp.Diff(tc.want, since(t0, b.seen())); diff != "" {
					t.Errorf("heartbeat times (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// What the heartbeats say: the records so far, as the run's record should
// it end now. A request in flight is an attempt of kind timeout that
// nobody saw end; while the chain waits, the failed attempts alone.
func TestHeartbeatDetails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &chain{Backends: []backend{{Model: "a", Call: newFake(status(503, ""), stream(30, s)).call, Retry: llmretry.Policy{Waits: []time.Duration{15 * s}}}}}
		run := func(ctx context.Context) (string, error) { return temporalretry.Do(ctx, c, "hi") }
		b := &beats{}
		env := activityEnv(t, b)
		env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
		if _, err := env.ExecuteActivity("run"); err != nil {
			t.Fatalf("ExecuteActivity() = %v", err)
		}
		type summary struct {
			Outcome string
			Kinds   []llmretry.Kind
			Lost    bool // the last attempt is a request in flight
		}
		var got []summary
		for _, h := range b.seen() {
			if h.V != 1 || h.Run != 1 || h.Ended || len(h.Earlier) != 0 {
				t.Errorf("heartbeat %+v, want version 1 of run 1, not ended, with no earlier runs", h)
			}
			s := summary{Outcome: h.Record.Outcome}
			for _, a := range h.Record.Attempts {
				s.Kinds = append(s.Kinds, a.Kind)
			}
			if n := len(h.Record.Attempts); n > 0 {
				last := h.Record.Attempts[n-1]
				s.Lost = last.Err != nil && last.Err.Error() == "temporalretry: no answer seen: the activity attempt ended without a word (heartbeat timeout, start-to-close timeout or the worker's death) while this request was in flight"
			}
			got = append(got, s)
		}
		to, tr := llmretry.KindTimeout, llmretry.KindTransient
		waiting := summary{Outcome: "timed_out", Kinds: []llmretry.Kind{tr}}
		streaming := summary{Outcome: "timed_out", Kinds: []llmretry.Kind{tr, to}, Lost: true}
		want := []summary{
			{Outcome: "timed_out"}, // the run's start
			{Outcome: "timed_out", Kinds: []llmretry.Kind{to}, Lost: true}, // the first request in flight
			waiting,                         // the 503
			waiting,                         // the wait's tick at 10s
			streaming,                       // the retry's start, at 15s
			streaming, streaming, streaming, // its progress at 25s, 35s, 45s
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("heartbeats (-want +got):\n%s", diff)
		}
		// The last heartbeat's request in flight is the stream, as far as
		// it got.
		hs := b.seen()
		if n := len(hs[len(hs)-1].Record.Attempts); n != 2 {
			t.Fatalf("last heartbeat has %d attempts, want 2", n)
		}
		last := hs[len(hs)-1].Record.Attempts[1]
		if last.Try != 2 || last.Elapsed != 30*s || last.Next != llmretry.NextStop || last.Why != llmretry.WhyDeadline {
			t.Errorf("last heartbeat's request in flight = %+v, want try 2, 30s so far, stop: deadline", last)
		}
	})
}

// With a HeartbeatTimeout, a run waits heartbeating every quarter of it.
func TestHeartbeatEveryQuarterOfTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &chain{Backends: []backend{{Model: "a", Call: newFake(status(503, ""), answer("ok")).call, Retry: llmretry.Policy{Waits: []time.Duration{5 * s}}}}}
		var t0 time.Time
		run := func(ctx context.Context) (string, error) {
			t0 = time.Now()
			return temporalretry.Do(ctx, c, "hi")
		}
		wf := func(ctx workflow.Context) (string, error) {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
				StartToCloseTimeout: time.Minute,
				HeartbeatTimeout:    8 * s,
				RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
			})
			var answer string
			err := workflow.ExecuteActivity(ctx, "run").Get(ctx, &answer)
			return answer, err
		}
		b := &beats{}
		env := workflowEnv(t, b)
		env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
		env.RegisterWorkflow(wf)
		env.ExecuteWorkflow(wf)
		if err := env.GetWorkflowError(); err != nil {
			t.Fatalf("workflow: %v", err)
		}
		want := []time.Duration{0, 0, 0, 2 * s, 4 * s, 5 * s}
		if diff := cmp.Diff(want, since(t0, b.seen())); diff != "" {
			t.Errorf("heartbeat times (-want +got):\n%s", diff)
		}
	})
}
