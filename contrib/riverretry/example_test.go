package riverretry_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
)

// SummarizeArgs is a job: summarize one document.
type SummarizeArgs struct {
	DocID int64  `json:"doc_id"`
	Text  string `json:"text"`
}

// Kind names the job kind in River's table.
func (SummarizeArgs) Kind() string { return "summarize" }

// SummarizeWorker runs each document through a chain. It returns the
// chain's error as it is: the adapter, installed as middleware, decides
// what River does with the job.
type SummarizeWorker struct {
	river.WorkerDefaults[SummarizeArgs]
	Chain *llmretry.Chain[string, string]
}

// Work summarizes the job's document.
func (w *SummarizeWorker) Work(ctx context.Context, job *river.Job[SummarizeArgs]) error {
	summary, err := w.Chain.Do(ctx, job.Args.Text) // ctx carries River's JobTimeout as its deadline
	if err != nil {
		return err
	}
	log.Printf("document %d: %s", job.Args.DocID, summary)
	return nil
}

// call stands for a provider call; examples/outage in the llmretry module
// has real ones over net/http.
func call(model string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, text string) (string, error) {
		return "", errors.New("call " + model + " here")
	}
}

// A worker process: run it on as many machines as you like against the
// same database. River's JobTimeout of two minutes is each run's deadline;
// the chain keeps a 5s reserve, so a run retries a failing provider for
// up to about 1m55s, and a retry-after that does not fit snoozes the job
// instead of spending an attempt.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	policy := llmretry.Policy{
		Waits:   []time.Duration{2 * time.Second, 8 * time.Second, 30 * time.Second},
		Jitter:  0.2,
		Reserve: 5 * time.Second,  // a job has nothing to do after the chain returns
		MaxWait: 30 * time.Second, // a longer retry-after becomes a snooze
	}
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: call("gpt-4o"), Retry: policy, Timeout: 45 * time.Second},
			{Model: "claude-sonnet", Call: call("claude-sonnet"), Retry: policy, Timeout: 45 * time.Second},
		},
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &SummarizeWorker{Chain: chain})

	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}},
		Workers: workers,
		// The adapter maps every run's error; the handler cancels the
		// items that must not run again, storing the chain's JSON record
		// alone as the run's error entry.
		Middleware:   []rivertype.Middleware{&riverretry.Adapter{CancelByHandler: true}},
		ErrorHandler: &riverretry.ErrorHandler{},
		JobTimeout:   2 * time.Minute,
		MaxAttempts:  5,
		// A killed machine's jobs come back this long after they started.
		RescueStuckJobsAfter: 3 * time.Minute,
		// On SIGTERM, running chains get this long to finish; then they
		// are cancelled, and their jobs go back without using an attempt.
		SoftStopTimeout: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-client.Stopped()
}

// A worker that maps its own return value, for a client whose Config
// another team owns. Without an ErrorHandler installed, the zero Adapter
// cancels with river.JobCancel.
func ExampleAdapter_Result() {
	var adapter riverretry.Adapter
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{Model: "gpt-4o", Call: call("gpt-4o")}},
	}
	work := func(ctx context.Context, job *river.Job[SummarizeArgs]) error {
		_, err := chain.Do(ctx, job.Args.Text)
		return adapter.Result(ctx, job.JobRow, err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(work))
}

// What River stores for a run that failed: the chain's record as JSON,
// which a query over the errors column can take apart.
func ExampleError() {
	raw := "Retries need jitter because"
	err := llmretry.Exhaust([]llmretry.Attempt{{
		Model: "gpt-4o", Try: 1, Kind: llmretry.KindTruncated, Status: 200, RawText: &raw,
		Err: errors.New("finish_reason length"), Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable,
	}})
	var adapter riverretry.Adapter
	mapped := adapter.Result(context.Background(), &rivertype.JobRow{ID: 1, Attempt: 1}, err)

	var cancel *rivertype.JobCancelError
	fmt.Println("cancel:", errors.As(mapped, &cancel))
	var stored *riverretry.Error
	if errors.As(mapped, &stored) {
		fmt.Println(stored.Error())
	}
	// Output:
	// cancel: true
	// {"outcome":"truncated","item_retryable":false,"error":"llmretry: truncated after 1 attempt on 1 backend: raise the completion budget (max tokens)\n\t[backend 0 gpt-4o try 1] finish_reason length (stopping: not_retryable)","usage_unknown":1,"attempts":[{"backend":0,"model":"gpt-4o","try":1,"kind":"truncated","status":200,"error":"finish_reason length","raw_text":"Retries need jitter because","start":"0001-01-01T00:00:00Z","elapsed_ms":0,"next":"stop","why":"not_retryable","retry_in_ms":0,"delivered":false}]}
}
