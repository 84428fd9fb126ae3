package temporalretry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/llmretrytest"
)

// retryAfter is what the rate-limited items' provider asks for: longer
// than the chain's MaxWait, so a run ends with the advice instead of
// waiting, and Temporal's next run must come no sooner.
const retryAfter = 3 * time.Second

// category is one behaviour of the provider, and how many items meet it.
type category struct {
	name string
	n    int
	// script scripts the item's two models: id for the primary backend,
	// id+"-b" for the secondary.
	script func(id string, srv *llmretrytest.Server)
}

func words(n int) string { return strings.TrimSpace(strings.Repeat("word ", n)) }

var categories = []category{
	{"ok", 20, func(id string, srv *llmretrytest.Server) {
		srv.Script(id, llmretrytest.Answer("Hello from "+id))
	}},
	// A stream of 15s, running on the worker that is stopped, then one of
	// 5s, more than twice the HeartbeatTimeout, on the other worker: it
	// lives by its progress.
	{"stream", 20, func(id string, srv *llmretrytest.Server) {
		srv.Script(id, llmretrytest.Answer(words(150)).Every(100*time.Millisecond), llmretrytest.Answer(words(50)).Every(100*time.Millisecond))
	}},
	{"truncated", 15, func(id string, srv *llmretrytest.Server) {
		srv.Script(id, llmretrytest.Truncated("The answer of "+id+" stopped"))
		srv.Script(id+"-b", llmretrytest.Truncated("The answer of "+id+"-b stopped"))
	}},
	{"ratelimited", 15, func(id string, srv *llmretrytest.Server) {
		limited := llmretrytest.Status(429).WithHeader("retry-after", fmt.Sprint(int(retryAfter/time.Second)))
		srv.Script(id, limited, llmretrytest.Answer("Hello from "+id))
		srv.Script(id+"-b", limited)
	}},
	// Both backends fail the first run's tries; the primary answers the
	// second run.
	{"outage", 20, func(id string, srv *llmretrytest.Server) {
		srv.Script(id, llmretrytest.Status(503), llmretrytest.Status(503), llmretrytest.Answer("Hello from "+id))
		srv.Script(id+"-b", llmretrytest.Status(503))
	}},
	{"dead", 10, func(id string, srv *llmretrytest.Server) {
		srv.Script(id, llmretrytest.Status(503))
		srv.Script(id+"-b", llmretrytest.Status(503))
	}},
}

// TestTemporalOutage runs a workflow of 100 items on a real Temporal
// server, with two workers, against a scripted provider playing an
// outage, and checks how every item ended and that every request the
// provider saw is in the records. Worker A runs alone at first; once the
// quick items are settled, worker B starts and worker A is stopped with
// the long streams in flight, which complete on B.
func TestTemporalOutage(t *testing.T) {
	addr := temporalAddr(t)
	c := dial(t, addr)
	srv := llmretrytest.NewServer()
	t.Cleanup(srv.Close)

	var (
		items []item
		catOf = map[string]string{}
	)
	for _, cat := range categories {
		for i := range cat.n {
			id := fmt.Sprintf("%s-%d", cat.name, i)
			cat.script(id, srv)
			items = append(items, item{ID: id})
			catOf[id] = cat.name
		}
	}
	if len(items) != 100 {
		t.Fatalf("categories hold %d items, want 100", len(items))
	}

	queue := fmt.Sprintf("llmretry-outage-%d", time.Now().UnixNano())
	changed := make(changes, 1)
	runs := &runLog{changed: changed}
	dead := &deadLog{changed: changed}
	chain := newItemChain(srv.OpenAIBaseURL())
	newWorker := func(name string) worker.Worker { return newTestWorker(t, c, queue, name, chain, runs, dead) }
	a := newWorker("worker-a")
	aStopped := false
	t.Cleanup(func() {
		if !aStopped {
			a.Stop()
		}
	})

	begin := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	wr, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: queue, TaskQueue: queue}, "items", items)
	if err != nil {
		t.Fatalf("ExecuteWorkflow() = %v", err)
	}

	// Worker A alone settles the quick items, and starts every stream.
	settled := func() bool {
		byItem := runs.byItem()
		deadIDs := dead.ids()
		for _, it := range items {
			switch catOf[it.ID] {
			case "truncated", "dead":
				if !deadIDs[it.ID] {
					return false
				}
			case "ok", "outage":
				rs := byItem[it.ID]
				if len(rs) == 0 || rs[len(rs)-1].end.IsZero() || rs[len(rs)-1].err != nil {
					return false
				}
			case "stream":
				if !runs.inFlight("worker-a", it.ID) {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, changed, 12*time.Second, "worker A to settle the quick items with every stream in flight", settled)
	t.Logf("quick items settled after %v; starting worker B and stopping worker A", time.Since(begin).Round(time.Millisecond))
	b := newWorker("worker-b")
	t.Cleanup(b.Stop)
	a.Stop()
	aStopped = true

	var outcomes []outcome
	if err := wr.Get(ctx, &outcomes); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	t.Logf("100 items final after %v", time.Since(begin).Round(time.Millisecond))
	if len(outcomes) != len(items) {
		t.Fatalf("workflow returned %d outcomes, want %d", len(outcomes), len(items))
	}

	requests := map[string][]llmretrytest.Request{} // by item
	for _, r := range srv.Requests() {
		id := strings.TrimSuffix(r.Model, "-b")
		requests[id] = append(requests[id], r)
	}
	byItem := runs.byItem()
	counts := map[string]map[string]int{}
	for _, o := range outcomes {
		cat := catOf[o.ID]
		state := "done"
		if o.Dead != nil {
			state = "dead: " + string(o.Dead.Why)
		}
		if counts[cat] == nil {
			counts[cat] = map[string]int{}
		}
		counts[cat][state]++
		checkAccounted(t, o, requests[o.ID], byItem[o.ID])

		switch cat {
		case "ok":
			checkDone(t, o, byItem[o.ID], 1)
		case "outage":
			checkDone(t, o, byItem[o.ID], 2)
			if o.Result != nil && len(o.Result.Runs.Earlier) == 1 {
				rec := decodeRecord(t, o.Result.Runs.Earlier[0])
				if rec.Outcome != "exhausted" || len(rec.Attempts) != 4 {
					t.Errorf("%s: first run's record = %+v, want exhausted after 4 attempts", o.ID, rec)
				}
			}
		case "stream":
			checkStream(t, o, byItem[o.ID])
		case "ratelimited":
			checkDone(t, o, byItem[o.ID], 2)
			checkRetryAfter(t, o.ID, requests[o.ID], byItem[o.ID])
		case "truncated":
			checkDead(t, o, byItem[o.ID], batch.WhyNotRetryable, 1, "truncated")
		case "dead":
			checkDead(t, o, byItem[o.ID], batch.WhyRunsUsed, 3, "exhausted")
		default:
			t.Errorf("outcome for %q, which no category has", o.ID)
		}
	}
	for _, cat := range categories {
		for state, n := range counts[cat.name] {
			t.Logf("%-11s %-20s %3d", cat.name, state, n)
		}
	}
	t.Logf("provider requests: %d; the stopped runs' records: %v", len(srv.Requests()), stoppedAs)
	// A stopped run sends its own record as it returns, although its
	// context is done; one whose send raced the SDK's heartbeat batching
	// leaves its last heartbeat's instead, which accounts for the same
	// requests. Most must be their own.
	if stoppedAs["cancelled"] <= stoppedAs["timed_out"] {
		t.Errorf("the stopped runs' records: %v, want most of them cancelled, their own", stoppedAs)
	}
}

// checkDone: the item completed after want runs, the last one's answer.
// (checkAccounted checks that the records know each of them.)
func checkDone(t *testing.T, o outcome, rs []run, want int) {
	t.Helper()
	if o.Result == nil {
		t.Errorf("%s: dead (%s), want done", o.ID, o.Dead.Why)
		return
	}
	if len(rs) != want {
		t.Errorf("%s: done after %d runs, want %d", o.ID, len(rs), want)
	}
}

// checkDead: the item was dead-lettered after want runs, why, with its
// last run's outcome.
func checkDead(t *testing.T, o outcome, rs []run, why batch.Why, want int, outcome string) {
	t.Helper()
	if o.Dead == nil {
		t.Errorf("%s: done, want dead: %s", o.ID, why)
		return
	}
	dl := o.Dead
	if dl.Why != why || dl.Runs != want || len(rs) != want {
		t.Errorf("%s: dead letter why %s after %d runs (%d ran); want %s after %d", o.ID, dl.Why, dl.Runs, len(rs), why, want)
	}
	if rec := decodeRecord(t, dl.Error); rec.Outcome != outcome || len(rec.Attempts) == 0 {
		t.Errorf("%s: dead letter's record %s, want outcome %s with its attempts", o.ID, dl.Error, outcome)
	}
}

// stoppedAs counts the stopped runs' records by outcome.
var stoppedAs = map[string]int{}

// checkStream: the stream's first run was on worker A, stopped under it;
// the second completed on worker B, streaming for longer than the
// HeartbeatTimeout.
func checkStream(t *testing.T, o outcome, rs []run) {
	t.Helper()
	checkDone(t, o, rs, 2)
	if o.Result == nil || len(rs) != 2 {
		t.Errorf("%s: %d runs, want 2", o.ID, len(rs))
		return
	}
	if rs[0].worker != "worker-a" || o.Result.Worker != "worker-b" {
		t.Errorf("%s: runs on %s then %s, answered by %s; want worker-a, then worker-b", o.ID, rs[0].worker, rs[1].worker, o.Result.Worker)
	}
	if len(o.Result.Runs.Earlier) == 1 {
		// The stopped run's record: its own, a Cancelled, when its last
		// heartbeat reached the server; else the one its heartbeats left.
		rec := decodeRecord(t, o.Result.Runs.Earlier[0])
		if rec.Outcome != "cancelled" && rec.Outcome != "timed_out" {
			t.Errorf("%s: the stopped run's record = %+v, want cancelled (or timed out)", o.ID, rec)
		}
		stoppedAs[rec.Outcome]++
	}
	if took := rs[1].end.Sub(rs[1].start); took < 2*itemOptions.HeartbeatTimeout {
		t.Errorf("%s: the second run took %v, want a stream longer than twice the HeartbeatTimeout", o.ID, took)
	}
}

// checkRetryAfter: the rate-limited item's next run started no sooner
// than the provider asked, counted from its 429: Temporal held it back
// (a run that starts early would wait out the rest itself, so the
// request alone cannot tell), and so did its second request.
func checkRetryAfter(t *testing.T, id string, reqs []llmretrytest.Request, rs []run) {
	t.Helper()
	var primary []llmretrytest.Request
	for _, r := range reqs {
		if r.Model == id {
			primary = append(primary, r)
		}
	}
	if len(primary) != 2 || len(rs) != 2 {
		t.Errorf("%s: %d requests to the primary in %d runs, want 2 in 2", id, len(primary), len(rs))
		return
	}
	if gap := rs[1].start.Sub(primary[0].Time); gap < retryAfter {
		t.Errorf("%s: the next run started %v after the 429, want at least the %v it asked for", id, gap, retryAfter)
	}
	if gap := primary[1].Time.Sub(primary[0].Time); gap < retryAfter {
		t.Errorf("%s: the next request came %v after the 429, want at least %v", id, gap, retryAfter)
	}
}

// checkAccounted: every request the provider saw for the item is an
// attempt in its records — the earlier runs', and the last run's — and
// the records know every run the workers ran.
func checkAccounted(t *testing.T, o outcome, reqs []llmretrytest.Request, rs []run) {
	t.Helper()
	var (
		recorded int
		runs     int
		earlier  []json.RawMessage
		omitted  int
	)
	switch {
	case o.Result != nil:
		for _, a := range o.Result.Attempts {
			if !a.Skipped {
				recorded++
			}
		}
		runs, earlier, omitted = o.Result.Runs.Run, o.Result.Runs.Earlier, o.Result.Runs.Omitted
	case o.Dead != nil:
		recorded = sent(t, o.Dead.Error)
		runs, earlier, omitted = o.Dead.Runs, o.Dead.Earlier, o.Dead.Omitted
	}
	for _, e := range earlier {
		recorded += sent(t, e)
	}
	if recorded != len(reqs) {
		t.Errorf("%s: %d requests in the records, the provider saw %d", o.ID, recorded, len(reqs))
	}
	// The records omit only runs that never ran: Temporal may hand a run
	// to the worker that is stopping, which drops it, and the run leaves
	// no heartbeat; it sent nothing, and runs again on the other worker.
	if runs-omitted != len(rs) || len(earlier) != runs-1-omitted {
		t.Errorf("%s: the records know %d runs, %d of them omitted, and hold %d earlier; the workers ran %d", o.ID, runs, omitted, len(earlier), len(rs))
	}
}
