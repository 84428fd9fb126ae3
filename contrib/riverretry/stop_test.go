package riverretry_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// TestRiverStopMidRun stops one of two clients with StopAndCancel while
// its jobs are in flight. Their chains return *llmretry.Cancelled, which
// the adapter hands back unchanged: River puts each job back without
// spending an attempt or storing an error, the adapter counts the
// cancellation in the job's metadata, and the other client finishes every
// job, each exactly once.
//
// The stopped client uses the adapter one way or the other: its worker
// calls the function, or it has the middleware installed.
func TestRiverStopMidRun(t *testing.T) {
	url := pgURL(t)
	for _, middleware := range []bool{false, true} {
		name := "function"
		if middleware {
			name = "middleware"
		}
		t.Run(name, func(t *testing.T) { testStopMidRun(t, url, "llmretry_river_stop_"+name, middleware) })
	}
}

func testStopMidRun(t *testing.T, url, schema string, middleware bool) {
	freshSchema(t, url, schema)

	openai := llmretrytest.NewServer()
	t.Cleanup(openai.Close)
	anthropic := llmretrytest.NewServer()
	t.Cleanup(anthropic.Close)

	// Every job's first answer takes a while, long enough for the stop
	// to catch it in flight, and well inside JobTimeout; a second request
	// is answered at once.
	const (
		total = 40
		slow  = 1500 * time.Millisecond
	)
	var inserts []river.InsertManyParams
	for i := range total {
		model := fmt.Sprintf("busy-%d", i)
		openai.Script(model, llmretrytest.Answer("late").After(slow), llmretrytest.Answer("Hello from "+model))
		anthropic.Script(model, llmretrytest.Answer("never asked"))
		inserts = append(inserts, river.InsertManyParams{Args: chatArgs{Model: model}})
	}

	chain := newChain(openai, anthropic)
	log := &runLog{}
	startedB := make(chan int64, total*4) // never blocks a worker
	// A can run 30 at once and B 10, so B gets at least 10 of the 40.
	a := machine{
		id: "machine-a", maxWorkers: 30, jobTimeout: 10 * time.Second, log: log,
		worker:     &chatWorker{chain: chain},
		middleware: []rivertype.Middleware{&riverretry.Adapter{CancelByHandler: true}},
		handler:    &riverretry.ErrorHandler{},
	}
	b := machine{
		id: "machine-b", maxWorkers: 10, jobTimeout: 10 * time.Second, log: log, started: startedB,
		worker: &chatWorker{chain: chain, adapter: &riverretry.Adapter{}},
	}
	if middleware {
		b.worker = &chatWorker{chain: chain}
		b.middleware = []rivertype.Middleware{&riverretry.Adapter{}}
	}
	clientA, eventsA := a.start(t, url, schema)
	clientB, eventsB := b.start(t, url, schema)

	if _, err := clientA.InsertMany(t.Context(), inserts); err != nil {
		t.Fatalf("InsertMany() = %v", err)
	}
	// Stop B once five of its runs are under way.
	timeout := time.After(30 * time.Second)
	for range 5 {
		select {
		case <-startedB:
		case <-timeout:
			t.Fatal("machine-b did not start 5 runs within 30s")
		}
	}
	if err := clientB.StopAndCancel(t.Context()); err != nil {
		t.Fatalf("StopAndCancel(machine-b) = %v", err)
	}
	waitFinal(t, clientA, total, 60*time.Second, eventsA, eventsB)

	jobs := allJobs(t, clientA)
	if len(jobs) != total {
		t.Fatalf("river_job holds %d jobs, want %d", len(jobs), total)
	}
	runs := log.byJob()
	interrupted := 0
	for _, job := range jobs {
		model := argsOf(t, job).Model
		md, err := riverretry.JobMetadata(job)
		if err != nil {
			t.Fatalf("JobMetadata(%s) = %v", model, err)
		}
		checkRuns(t, job, model, runs[job.ID])
		// Nothing lost or discarded, no attempt spent and no error stored
		// because a worker shut down.
		if job.State != rivertype.JobStateCompleted || job.Attempt != 1 || len(job.Errors) != 0 {
			t.Errorf("%s: state %s, attempt %d, errors %v; want completed on attempt 1 with no error stored",
				model, job.State, job.Attempt, job.Errors)
		}
		cancelled := 0
		for _, r := range runs[job.ID] {
			if r.returned == nil {
				if r.client != a.id {
					t.Errorf("%s: completed by %s, which was stopped before its runs could finish", model, r.client)
				}
				continue
			}
			var c *llmretry.Cancelled
			if r.client != b.id || !errors.As(r.chainErr, &c) {
				t.Errorf("%s: a run on %s failed with %v, want only machine-b's runs cancelled", model, r.client, r.chainErr)
				continue
			}
			// Unchanged: the very error the chain returned.
			if r.returned != r.chainErr {
				t.Errorf("%s: the adapter returned %v for the chain's *Cancelled, want it unchanged", model, r.returned)
			}
			cancelled++
		}
		if md.Cancellations != cancelled {
			t.Errorf("%s: metadata counts %d cancellations, want %d (the runs cut short)", model, md.Cancellations, cancelled)
		}
		interrupted += cancelled
	}
	t.Logf("machine-b stopped with %d runs in flight; machine-a finished all %d jobs", interrupted, total)
	if interrupted == 0 {
		t.Error("no run was cut short, want machine-b stopped with runs in flight")
	}
}
