// Command worker is a River worker process that runs every job through an
// llmretry.Chain, with the riverretry adapter deciding what River does
// with each failure. Start as many as you like, on one machine or many,
// against the same PostgreSQL database; they share the work.
//
// The providers are scripted llmretrytest servers inside each process, so
// the demo needs no API keys: a job's model name decides what it meets
// (flaky-N answers after a 503, limited-N is rate-limited with retry-after
// 8 once and then answers, cut-N is truncated every time). Each process
// plays a model's script from its start, so a job that moves to another
// process meets its script afresh.
//
//	export LLMRETRY_PG_URL="$(.ci/postgres.sh)"   # as root, from the repository
//	cd contrib/riverretry
//	go run ./examples/worker -insert 30            # migrates, adds 30 jobs, works
//	go run ./examples/worker                       # a second worker, in another terminal
//
// It prints each job as it ends, and stops on Ctrl-C: running chains get
// SoftStopTimeout to finish, then are cancelled, and their jobs go back to
// the table without using an attempt.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// PromptArgs is a job: one prompt for one model.
type PromptArgs struct {
	Model  string `json:"model"`
	Prompt string `json:"prompt"`
}

// Kind names the job kind in River's table.
func (PromptArgs) Kind() string { return "llmretry_prompt" }

// PromptWorker runs a job through the chain and returns the chain's error
// as it is; the adapter, installed as middleware, maps it.
type PromptWorker struct {
	river.WorkerDefaults[PromptArgs]
	Chain *llmretry.Chain[PromptArgs, string]
}

// Work answers the job's prompt.
func (w *PromptWorker) Work(ctx context.Context, job *river.Job[PromptArgs]) error {
	answer, err := w.Chain.Do(ctx, job.Args) // River's JobTimeout is the chain's deadline
	if err == nil {
		log.Printf("job %d %s: %q", job.ID, job.Args.Model, answer)
	}
	return err
}

func main() {
	dbURL := flag.String("db", os.Getenv("LLMRETRY_PG_URL"), "PostgreSQL URL (default $LLMRETRY_PG_URL)")
	insert := flag.Int("insert", 0, "insert this many demo jobs before working")
	flag.Parse()
	if *dbURL == "" {
		log.Fatal("worker: no database: set LLMRETRY_PG_URL or pass -db")
	}
	if err := run(*dbURL, *insert); err != nil {
		log.Fatal("worker: ", err)
	}
}

func run(dbURL string, insert int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Migrating is idempotent, and safe from every worker at once.
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}

	providers := newProviders()
	defer providers.close()

	// One run sends at most four requests, within JobTimeout minus the
	// reserve: River runs the job again, so a run need not retry until
	// its deadline. A retry-after longer than MaxWait, or one that would
	// end inside the reserve, ends the run with advice instead, and the
	// adapter snoozes the job rather than spending an attempt.
	policy := llmretry.Policy{
		Waits:    []time.Duration{time.Second, 2 * time.Second},
		MaxTries: 4,
		Jitter:   0.2,
		Reserve:  5 * time.Second,
		MaxWait:  5 * time.Second,
	}
	chain := &llmretry.Chain[PromptArgs, string]{
		Backends: []llmretry.Backend[PromptArgs, string]{
			{Model: "primary", Call: providers.call, Retry: policy, Timeout: 10 * time.Second},
		},
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &PromptWorker{Chain: chain})

	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:              workers,
		Middleware:           []rivertype.Middleware{&riverretry.Adapter{CancelByHandler: true}},
		ErrorHandler:         &riverretry.ErrorHandler{},
		JobTimeout:           30 * time.Second,
		MaxAttempts:          5,
		RescueStuckJobsAfter: 90 * time.Second,
		SoftStopTimeout:      10 * time.Second,
	})
	if err != nil {
		return err
	}
	if insert > 0 {
		kinds := []string{"flaky", "limited", "cut"}
		params := make([]river.InsertManyParams, insert)
		for i := range params {
			model := fmt.Sprintf("%s-%d", kinds[i%len(kinds)], i)
			params[i] = river.InsertManyParams{Args: PromptArgs{Model: model, Prompt: "Say hello."}}
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("inserting: %w", err)
		}
		log.Printf("inserted %d jobs", insert)
	}

	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled,
		river.EventKindJobFailed, river.EventKindJobSnoozed, river.EventKindJobInterrupted)
	defer cancel()
	go report(events)

	if err := client.Start(ctx); err != nil {
		return err
	}
	log.Printf("worker %s started; Ctrl-C stops it", client.ID())
	<-client.Stopped()
	return nil
}

// report prints each job's state as a run ends.
func report(events <-chan *river.Event) {
	for ev := range events {
		md, _ := riverretry.JobMetadata(ev.Job)
		line := fmt.Sprintf("job %d %s: %s (attempt %d of %d, snoozes %d, cancellations %d)",
			ev.Job.ID, modelOf(ev.Job), ev.Job.State, ev.Job.Attempt, ev.Job.MaxAttempts, md.Snoozes, md.Cancellations)
		if n := len(ev.Job.Errors); n > 0 && ev.Kind != river.EventKindJobSnoozed {
			line += "\n  stored error: " + ev.Job.Errors[n-1].Error
		}
		log.Print(line)
	}
}

func modelOf(job *rivertype.JobRow) string {
	var a PromptArgs
	_ = json.Unmarshal(job.EncodedArgs, &a)
	return a.Model
}

// providers is this process's scripted provider: each model is scripted
// by its name the first time a job asks for it.
type providers struct {
	srv      *llmretrytest.Server
	mu       sync.Mutex
	scripted map[string]bool
}

func newProviders() *providers {
	return &providers{srv: llmretrytest.NewServer(), scripted: map[string]bool{}}
}

func (p *providers) close() { p.srv.Close() }

func (p *providers) script(model string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.scripted[model] {
		return
	}
	p.scripted[model] = true
	switch {
	case strings.HasPrefix(model, "flaky-"):
		p.srv.Script(model, llmretrytest.Status(503), llmretrytest.Answer("Hello, after a 503."))
	case strings.HasPrefix(model, "limited-"):
		// A retry-after longer than MaxWait: the job is snoozed.
		p.srv.Script(model, llmretrytest.Status(429).WithHeader("retry-after", "8"), llmretrytest.Answer("Hello, after a snooze."))
	default:
		p.srv.Script(model, llmretrytest.Truncated("Hello, and then the budget ran"))
	}
}

// call asks the scripted provider's OpenAI-compatible endpoint.
func (p *providers) call(ctx context.Context, a PromptArgs) (string, error) {
	p.script(a.Model)
	body, err := json.Marshal(map[string]any{
		"model":    a.Model,
		"messages": []map[string]string{{"role": "user", "content": a.Prompt}},
	})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.OpenAIBaseURL()+"chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode >= 400 {
		return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(http.StatusText(resp.StatusCode)))
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 {
		return "", llmretry.ParseFailure(string(data), fmt.Errorf("no answer: %v", err))
	}
	if c := out.Choices[0]; c.FinishReason == "length" {
		return "", llmretry.Truncation(c.Message.Content)
	}
	return out.Choices[0].Message.Content, nil
}
