package temporalretry_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The environment of the worker process that TestTemporalWorkerKilled
// starts, and kills.
const (
	helperVar      = "TEMPORALRETRY_TEST_WORKER" // the task queue; set only in the helper process
	helperProvider = "TEMPORALRETRY_TEST_PROVIDER"
)

// TestHelperWorker is not a test: it is the worker process that
// TestTemporalWorkerKilled runs this test binary as, and kills with
// SIGKILL. It polls until then.
func TestHelperWorker(t *testing.T) {
	queue := os.Getenv(helperVar)
	if queue == "" {
		t.Skip("the worker process of TestTemporalWorkerKilled")
	}
	c := dial(t, temporalAddr(t))
	w := newTestWorker(t, c, queue, "worker-killed", newItemChain(os.Getenv(helperProvider)), &runLog{changed: make(changes, 1)}, &deadLog{changed: make(changes, 1)})
	defer w.Stop()
	select {} // until the kill
}

// newTestWorker starts a worker of the items workflow on queue.
func newTestWorker(t *testing.T, c client.Client, queue, name string, chain *llmretry.Chain[item, string], runs *runLog, dead *deadLog) worker.Worker {
	t.Helper()
	w := worker.New(c, queue, worker.Options{Identity: name, WorkerStopTimeout: 300 * time.Millisecond})
	a := &acts{worker: name, chain: chain, runs: runs, dead: dead}
	w.RegisterWorkflowWithOptions(itemsWorkflow, workflow.RegisterOptions{Name: "items"})
	w.RegisterActivityWithOptions(a.item, activity.RegisterOptions{Name: "item"})
	w.RegisterActivityWithOptions(a.deadLetter, activity.RegisterOptions{Name: "dead_letter"})
	if err := w.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	return w
}

// TestTemporalWorkerKilled kills a worker process outright, with SIGKILL,
// while its activities stream: nothing of it reports to Temporal again.
// After the HeartbeatTimeout, Temporal runs the items again on another
// worker, whose runs read the dead one's records from its heartbeats: the
// requests it left in flight are in the records, as timeouts nobody saw
// end, and every request the provider saw is accounted for.
func TestTemporalWorkerKilled(t *testing.T) {
	addr := temporalAddr(t)
	c := dial(t, addr)
	srv := llmretrytest.NewServer()
	t.Cleanup(srv.Close)
	var items []item
	for i := range 5 {
		id := fmt.Sprintf("killed-%d", i)
		// 15s of stream, cut by the kill; then a quick answer.
		srv.Script(id, llmretrytest.Answer(words(150)).Every(100*time.Millisecond), llmretrytest.Answer("Hello from "+id))
		items = append(items, item{ID: id})
	}
	queue := fmt.Sprintf("llmretry-killed-%d", time.Now().UnixNano())

	helper := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.v")
	helper.Env = append(os.Environ(), helperVar+"="+queue, helperProvider+"="+srv.OpenAIBaseURL(), addrVar+"="+addr)
	var helperOut strings.Builder
	helper.Stdout, helper.Stderr = &helperOut, &helperOut
	if err := helper.Start(); err != nil {
		t.Fatalf("starting the worker process: %v", err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = helper.Process.Kill()
			_ = helper.Wait()
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	wr, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: queue, TaskQueue: queue}, "items", items)
	if err != nil {
		t.Fatalf("ExecuteWorkflow() = %v", err)
	}

	// Kill the worker once Temporal holds, for every item, a heartbeat
	// whose record has the stream in flight: the SDK may keep a heartbeat
	// for up to 0.8 of the HeartbeatTimeout before it sends it, and a kill
	// before then would lose it (see the package documentation). The
	// server has no event to wait on: ask it every 100ms.
	inFlight := func() bool {
		desc, err := c.DescribeWorkflow(ctx, queue, "")
		if err != nil {
			return false
		}
		n := 0
		for _, pa := range desc.RawResponse.GetPendingActivities() {
			var h heartbeat
			if pa.GetHeartbeatDetails() == nil || converter.GetDefaultDataConverter().FromPayloads(pa.GetHeartbeatDetails(), &h) != nil {
				continue
			}
			if as := h.Record.Attempts; len(as) == 1 && as[0].Kind == llmretry.KindTimeout {
				n++
			}
		}
		return n == len(items)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !inFlight() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no heartbeat with the streams in flight before %v; worker process output:\n%s", ctx.Err(), helperOut.String())
		}
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatalf("killing the worker process: %v", err)
	}
	_ = helper.Wait()
	killed = true
	killedAt := time.Now()

	changed := make(changes, 1)
	runs := &runLog{changed: changed}
	b := newTestWorker(t, c, queue, "worker-b", newItemChain(srv.OpenAIBaseURL()), runs, &deadLog{changed: changed})
	t.Cleanup(b.Stop)
	var outcomes []outcome
	if err := wr.Get(ctx, &outcomes); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	t.Logf("%d items done %v after the kill", len(outcomes), time.Since(killedAt).Round(time.Millisecond))

	requests := map[string][]llmretrytest.Request{}
	for _, r := range srv.Requests() {
		requests[r.Model] = append(requests[r.Model], r)
	}
	for _, o := range outcomes {
		if o.Result == nil {
			t.Errorf("%s: dead, want done", o.ID)
			continue
		}
		res := o.Result
		if res.Worker != "worker-b" || res.Runs.Run != 2 || len(res.Runs.Earlier) != 1 {
			t.Errorf("%s: answered by %s on run %d with %d earlier records; want worker-b, run 2, 1 earlier", o.ID, res.Worker, res.Runs.Run, len(res.Runs.Earlier))
			continue
		}
		rec := decodeRecord(t, res.Runs.Earlier[0])
		if rec.Outcome != "timed_out" || len(rec.Attempts) != 1 {
			t.Errorf("%s: the killed run's record = %+v, want timed_out with its one request", o.ID, rec)
			continue
		}
		lost := rec.Attempts[0]
		if lost.Kind != llmretry.KindTimeout || lost.Try != 1 || lost.Err == nil || !strings.HasPrefix(lost.Err.Error(), "temporalretry: no answer seen") {
			t.Errorf("%s: the killed run's request = %+v, want try 1, a timeout nobody saw end", o.ID, lost)
		}
		// Every request the provider saw: the stream the kill cut, and
		// the answer.
		if got, want := 1+len(res.Attempts), len(requests[o.ID]); got != want {
			t.Errorf("%s: %d requests in the records, the provider saw %d", o.ID, got, want)
		}
	}
	if len(outcomes) != len(items) {
		t.Errorf("%d outcomes, want %d", len(outcomes), len(items))
	}
}
