package riverretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
)

// pgURLVar names the environment variable with the test database's URL,
// as .ci/postgres.sh prints it.
const pgURLVar = "LLMRETRY_PG_URL"

// pgURL returns the test database's URL. Without one the test is skipped,
// except in CI (CI=true), where a missing server is a failure: the
// integration test must never pass by not running.
func pgURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv(pgURLVar)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set, and CI=true: start PostgreSQL with .ci/postgres.sh and export its URL", pgURLVar)
		}
		t.Skipf("%s is not set; to run against a real PostgreSQL: export %s=\"$(.ci/postgres.sh)\"", pgURLVar, pgURLVar)
	}
	return url
}

// freshSchema drops and recreates schema, and runs River's migrations in
// it, so each test has its own river_job table and leader election. The
// schema is left in place when the test fails, to be looked at.
func freshSchema(t *testing.T, url, schema string) {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, url)
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE; CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: quietLogger(t)})
	if err != nil {
		t.Fatalf("rivermigrate.New() = %v", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		t.Fatalf("Migrate(up) = %v", err)
	}
	t.Logf("River migrations applied in schema %s: %d", schema, len(res.Versions))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("schema %s kept for inspection", schema)
			return
		}
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
}

// newPool opens a connection pool of its own: each client is a separate
// "machine", sharing nothing but the database.
func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("pgxpool.New() = %v", err)
	}
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatalf("cannot reach PostgreSQL at %s: %v", pgURLVar, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}

// chatArgs is a job: one prompt for one model. The model's name is the
// item's behaviour: each test scripts every model on its providers, so
// what a job meets is a property of the job, whichever client runs it.
type chatArgs struct {
	Model string `json:"model"`
}

func (chatArgs) Kind() string { return "llmretry_chat" }

// chatWorker runs a job's prompt through the chain. With adapter set it
// maps the error itself, as a worker that calls the function does;
// otherwise it returns the chain's error and relies on the middleware.
type chatWorker struct {
	river.WorkerDefaults[chatArgs]
	chain   *llmretry.Chain[chatArgs, string]
	adapter *riverretry.Adapter
}

func (w *chatWorker) Work(ctx context.Context, job *river.Job[chatArgs]) error {
	_, err := w.chain.Do(ctx, job.Args)
	if r := runFrom(ctx); r != nil {
		r.chainErr = err
	}
	if w.adapter != nil {
		return w.adapter.Result(ctx, job.JobRow, err)
	}
	return err
}

// run is one run of a job, as the test saw it.
type run struct {
	client   string
	job      int64
	attempt  int
	start    time.Time
	end      time.Time
	chainErr error // what the chain returned
	returned error // what River got, after the adapter
}

// runLog records every run on every client, in the order they end.
type runLog struct {
	mu   sync.Mutex
	runs []*run
}

type runKey struct{}

func runFrom(ctx context.Context) *run {
	r, _ := ctx.Value(runKey{}).(*run)
	return r
}

// recorder is a worker middleware installed outermost, so it sees what
// River gets back from the adapter, whichever way the client uses it.
func (l *runLog) recorder(client string, started chan<- int64) rivertype.WorkerMiddleware {
	return river.WorkerMiddlewareFunc(func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
		r := &run{client: client, job: job.ID, attempt: job.Attempt, start: time.Now()}
		if started != nil {
			started <- job.ID
		}
		r.returned = doInner(context.WithValue(ctx, runKey{}, r))
		r.end = time.Now()
		l.mu.Lock()
		l.runs = append(l.runs, r)
		l.mu.Unlock()
		return r.returned
	})
}

func (l *runLog) byJob() map[int64][]*run {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[int64][]*run{}
	for _, r := range l.runs {
		m[r.job] = append(m[r.job], r)
	}
	return m
}

// quickRetry is the test's River retry policy: a failed job is retried
// 100ms later, rather than after River's attempt^4 seconds.
type quickRetry struct{}

func (quickRetry) NextRetry(*rivertype.JobRow) time.Time {
	return time.Now().Add(100 * time.Millisecond)
}

// machine is the setup of one client.
type machine struct {
	id         string
	maxWorkers int
	jobTimeout time.Duration
	worker     *chatWorker
	middleware []rivertype.Middleware
	handler    river.ErrorHandler
	log        *runLog
	started    chan<- int64
}

// maxAttempts is River's MaxAttempts in these tests.
const maxAttempts = 3

// start makes and starts a client for m on its own pool, in schema.
func (m machine) start(t *testing.T, url, schema string) (*river.Client[pgx.Tx], <-chan *river.Event) {
	t.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, m.worker)
	client, err := river.NewClient(riverpgxv5.New(newPool(t, url)), &river.Config{
		ID:           m.id,
		Schema:       schema,
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: m.maxWorkers}},
		Workers:      workers,
		Middleware:   append([]rivertype.Middleware{m.log.recorder(m.id, m.started)}, m.middleware...),
		ErrorHandler: m.handler,
		// The chain's deadline: River cancels the work context after
		// JobTimeout, and the chain plans its waits against it.
		JobTimeout:  m.jobTimeout,
		MaxAttempts: maxAttempts,
		RetryPolicy: quickRetry{},
		// A crashed client's jobs come back after this; it must exceed
		// JobTimeout, or running jobs would be rescued.
		RescueStuckJobsAfter: m.jobTimeout + time.Minute,
		// Short snoozes and retries make jobs available with a future
		// scheduled_at, which only a fetch poll picks up.
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		TestOnly:          true,
		Logger:            quietLogger(t),
	})
	if err != nil {
		t.Fatalf("river.NewClient(%s) = %v", m.id, err)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 10000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobCancelled, river.EventKindJobFailed},
	})
	t.Cleanup(cancel)
	if err := client.Start(context.Background()); err != nil {
		t.Fatalf("Start(%s) = %v", m.id, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := client.Stop(ctx); err != nil {
			t.Errorf("Stop(%s) = %v", m.id, err)
		}
	})
	return client, events
}

// waitFinal waits until want distinct jobs have reached a final state
// (completed, cancelled or discarded), as the clients report it, or fails
// the test after limit, saying where the client's jobs stand.
func waitFinal(t *testing.T, client *river.Client[pgx.Tx], want int, limit time.Duration, events ...<-chan *river.Event) {
	t.Helper()
	final := map[int64]bool{}
	timeout := time.NewTimer(limit)
	defer timeout.Stop()
	merged := make(chan *river.Event)
	done := make(chan struct{})
	defer close(done)
	for _, ch := range events {
		go func() {
			for {
				select {
				case ev, ok := <-ch:
					if !ok {
						return
					}
					select {
					case merged <- ev:
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	for len(final) < want {
		select {
		case ev := <-merged:
			switch ev.Job.State {
			case rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
				final[ev.Job.ID] = true
			}
		case <-timeout.C:
			states := map[rivertype.JobState]int{}
			for _, job := range allJobs(t, client) {
				states[job.State]++
			}
			t.Fatalf("after %v, %d of %d jobs are final; jobs by state: %v", limit, len(final), want, states)
		}
	}
}

// allJobs lists every job in the client's schema.
func allJobs(t *testing.T, client *river.Client[pgx.Tx]) []*rivertype.JobRow {
	t.Helper()
	res, err := client.JobList(context.Background(), river.NewJobListParams().First(10000))
	if err != nil {
		t.Fatalf("JobList() = %v", err)
	}
	return res.Jobs
}

func argsOf(t *testing.T, job *rivertype.JobRow) chatArgs {
	t.Helper()
	var a chatArgs
	if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
		t.Fatalf("job %d: args %s: %v", job.ID, job.EncodedArgs, err)
	}
	return a
}

// stored is the chain's record as the adapter's errors store it.
type stored struct {
	Outcome       string             `json:"outcome"`
	ItemRetryable bool               `json:"item_retryable"`
	Error         string             `json:"error"`
	Attempts      []llmretry.Attempt `json:"attempts"`
}

func decodeStored(t *testing.T, job *rivertype.JobRow, text string) stored {
	t.Helper()
	var s stored
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		t.Fatalf("job %d: stored error is not the chain's JSON record: %v\n%s", job.ID, err, text)
	}
	return s
}

// chatReq is the body both provider calls send.
func chatBody(model string) map[string]any {
	return map[string]any{
		"model":      model,
		"max_tokens": 64,
		"messages":   []map[string]string{{"role": "user", "content": "Say hello."}},
	}
}

// httpClient has no timeout of its own: the chain's context ends each
// request, so a deadline is recorded as one.
var httpClient = &http.Client{}

func post(ctx context.Context, url string, header http.Header, in any) (int, http.Header, []byte, error) {
	data, err := json.Marshal(in)
	if err != nil {
		return 0, nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return 0, nil, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, body, err
}

// openAIChat calls an OpenAI-compatible Chat Completions endpoint.
func openAIChat(baseURL string) func(context.Context, chatArgs) (string, error) {
	return func(ctx context.Context, a chatArgs) (string, error) {
		status, header, body, err := post(ctx, baseURL+"chat/completions", nil, chatBody(a.Model))
		if err != nil {
			return "", err
		}
		if status >= 400 {
			return "", llmretry.StatusFailure(status, header, errors.New(strings.TrimSpace(string(body))))
		}
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) == 0 {
			return "", llmretry.ParseFailure(string(body), fmt.Errorf("no answer: %v", err))
		}
		if c := out.Choices[0]; c.FinishReason == "length" {
			return "", llmretry.Truncation(c.Message.Content)
		}
		return out.Choices[0].Message.Content, nil
	}
}

// anthropicChat calls an Anthropic-compatible Messages endpoint.
func anthropicChat(baseURL string) func(context.Context, chatArgs) (string, error) {
	header := http.Header{"X-Api-Key": {"test"}, "Anthropic-Version": {"2023-06-01"}}
	return func(ctx context.Context, a chatArgs) (string, error) {
		status, h, body, err := post(ctx, baseURL+"v1/messages", header, chatBody(a.Model))
		if err != nil {
			return "", err
		}
		if status >= 400 {
			return "", llmretry.StatusFailure(status, h, errors.New(strings.TrimSpace(string(body))))
		}
		var out struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			StopReason string `json:"stop_reason"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			return "", llmretry.ParseFailure(string(body), fmt.Errorf("no answer: %v", err))
		}
		var text strings.Builder
		for _, c := range out.Content {
			text.WriteString(c.Text)
		}
		if out.StopReason == "max_tokens" {
			return "", llmretry.Truncation(text.String())
		}
		return text.String(), nil
	}
}
