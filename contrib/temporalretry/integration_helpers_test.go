package temporalretry_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/temporalretry"
)

// addrVar names the environment variable with the Temporal server's
// address, as .ci/temporal.sh prints it.
const addrVar = "LLMRETRY_TEMPORAL_ADDR"

// temporalAddr returns the test server's address. Without one the test is
// skipped, except in CI (CI=true), where a missing server is a failure:
// the integration test must never pass by not running.
func temporalAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv(addrVar)
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set, and CI=true: start the server with .ci/temporal.sh and export its address", addrVar)
		}
		t.Skipf("%s is not set; to run against a real Temporal server: export %s=\"$(bash .ci/temporal.sh)\"", addrVar, addrVar)
	}
	return addr
}

// dial connects to the server, and closes the client when the test ends.
func dial(t *testing.T, addr string) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{HostPort: addr, Logger: quiet})
	if err != nil {
		t.Fatalf("client.Dial(%s) = %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// item is one piece of work: its ID is the model its provider scripts,
// so what the item meets is a property of the item, whichever worker
// runs it.
type item struct {
	ID string `json:"id"`
}

// itemResult is what a successful run returns: the answer, the worker
// that gave it, and every record of the item's runs — the earlier ones'
// from the heartbeats, and this run's attempts — so that the test can
// account for every request the provider saw.
type itemResult struct {
	Answer   string             `json:"answer"`
	Worker   string             `json:"worker"`
	Runs     temporalretry.Runs `json:"runs"`
	Attempts []llmretry.Attempt `json:"attempts"`
}

// outcome is how an item ended in the workflow: done, or dead.
type outcome struct {
	ID     string                    `json:"id"`
	Result *itemResult               `json:"result,omitempty"`
	Dead   *temporalretry.DeadLetter `json:"dead,omitempty"`
}

// itemsWorkflow runs every item's activity at once and routes each dead
// one to the dead-letter activity, as the package documentation shows.
func itemsWorkflow(ctx workflow.Context, items []item) ([]outcome, error) {
	ctx = workflow.WithActivityOptions(ctx, itemOptions)
	var (
		outcomes []outcome
		failed   error
	)
	wg := workflow.NewWaitGroup(ctx)
	for _, it := range items {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			var res itemResult
			err := workflow.ExecuteActivity(ctx, "item", it).Get(ctx, &res)
			if dl, ok := temporalretry.DeadLetterOf(it.ID, err); ok {
				if err := workflow.ExecuteActivity(ctx, "dead_letter", dl).Get(ctx, nil); err != nil {
					failed = err
				}
				outcomes = append(outcomes, outcome{ID: it.ID, Dead: &dl})
				return
			}
			if err != nil {
				failed = err
				return
			}
			outcomes = append(outcomes, outcome{ID: it.ID, Result: &res})
		})
	}
	wg.Wait(ctx)
	sort.Slice(outcomes, func(i, j int) bool { return outcomes[i].ID < outcomes[j].ID })
	return outcomes, failed
}

// The activity options of the integration tests, chosen together. A run
// may take 20s, its deadline and the chain's; the workers must heartbeat
// every 2s, which a stream of 5s or 15s does only through its progress.
// A failed run is run again 200ms later, three runs in all.
var itemOptions = workflow.ActivityOptions{
	StartToCloseTimeout: 20 * time.Second,
	HeartbeatTimeout:    2 * time.Second,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    200 * time.Millisecond,
		BackoffCoefficient: 1,
		MaximumAttempts:    3,
	},
}

// workerKey carries the name of the worker running an activity to the
// backend's Call and the chain's OnAttempt.
type workerKey struct{}

// collectorKey carries the attempts of one run to its activity.
type collectorKey struct{}

type collector struct {
	mu       sync.Mutex
	attempts []llmretry.Attempt
}

func (c *collector) add(a llmretry.Attempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts = append(c.attempts, a)
}

func (c *collector) all() []llmretry.Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]llmretry.Attempt(nil), c.attempts...)
}

// acts are one worker's activities.
type acts struct {
	worker string
	chain  *llmretry.Chain[item, string]
	runs   *runLog
	dead   *deadLog
}

func (a *acts) item(ctx context.Context, it item) (itemResult, error) {
	col := &collector{}
	ctx = context.WithValue(ctx, collectorKey{}, col)
	ctx = context.WithValue(ctx, workerKey{}, a.worker)
	r := a.runs.begin(a.worker, it.ID, int(activity.GetInfo(ctx).Attempt))
	answer, err := temporalretry.Do(ctx, a.chain, it)
	a.runs.end(r, err)
	if err != nil {
		return itemResult{}, err
	}
	return itemResult{Answer: answer, Worker: a.worker, Runs: temporalretry.EarlierRuns(ctx), Attempts: col.all()}, nil
}

func (a *acts) deadLetter(_ context.Context, dl temporalretry.DeadLetter) error {
	a.dead.add(dl)
	return nil
}

// newItemChain is the chain every item runs: the item's model on the
// provider, then its "-b" model on the same provider. Each backend is
// tried twice, 50ms apart; a retry-after longer than 1s is not waited
// for, so the run ends with the advice. The reserve is one second of the
// run's 20.
func newItemChain(baseURL string) *llmretry.Chain[item, string] {
	policy := llmretry.Policy{Waits: []time.Duration{50 * time.Millisecond}, MaxTries: 2, MaxWait: time.Second, Reserve: time.Second}
	return &llmretry.Chain[item, string]{
		Backends: []llmretry.Backend[item, string]{
			{Model: "primary", Call: streamChat(baseURL, ""), Retry: policy},
			{Model: "secondary", Call: streamChat(baseURL, "-b"), Retry: policy},
		},
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
			if col, ok := ctx.Value(collectorKey{}).(*collector); ok {
				col.add(a)
			}
		},
	}
}

// streamChat returns a backend call that asks the item's model (with
// suffix) for a streamed chat completion with plain net/http. It reads
// the stream whole and answers with it, telling the chain of each chunk
// with Progress: the activity hands nothing to its caller before it
// returns, so a cut stream may be sent again.
func streamChat(baseURL, suffix string) func(ctx context.Context, it item) (string, error) {
	return func(ctx context.Context, it item) (string, error) {
		body, err := json.Marshal(map[string]any{
			"model":    it.ID + suffix,
			"stream":   true,
			"messages": []map[string]string{{"role": "user", "content": "Summarize item " + it.ID}},
		})
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"chat/completions", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		if w, ok := ctx.Value(workerKey{}).(string); ok {
			req.Header.Set("X-Worker", w)
		}
		if activity.IsActivity(ctx) {
			req.Header.Set("X-Run", strconv.Itoa(int(activity.GetInfo(ctx).Attempt)))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(strings.TrimSpace(string(msg))))
		}
		var text strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				return text.String(), nil
			}
			var chunk struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(data), &chunk); err != nil {
				return "", fmt.Errorf("reading the stream: %w", err)
			}
			for _, c := range chunk.Choices {
				text.WriteString(c.Delta.Content)
				llmretry.Progress(ctx)
				if c.FinishReason == "length" {
					return "", llmretry.Truncation(text.String())
				}
			}
		}
		if err := sc.Err(); err != nil {
			return "", err
		}
		return "", io.ErrUnexpectedEOF // the stream ended without [DONE]
	}
}

// changes wakes waitFor whenever a log changes.
type changes chan struct{}

func (c changes) poke() {
	select {
	case c <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// runLog records every run on every worker.
type runLog struct {
	changed changes
	mu      sync.Mutex
	runs    []*run
}

// run is one run of an item, as its worker saw it.
type run struct {
	worker, item string
	n            int // the activity's attempt
	start, end   time.Time
	err          error
}

func (l *runLog) begin(worker, it string, n int) *run {
	r := &run{worker: worker, item: it, n: n, start: time.Now()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, r)
	l.changed.poke()
	return r
}

func (l *runLog) end(r *run, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.end, r.err = time.Now(), err
	l.changed.poke()
}

// byItem returns each item's runs, in the order they began.
func (l *runLog) byItem() map[string][]run {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string][]run{}
	for _, r := range l.runs {
		m[r.item] = append(m[r.item], *r)
	}
	return m
}

// inFlight reports whether worker is running a run of it.
func (l *runLog) inFlight(worker, it string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.runs {
		if r.worker == worker && r.item == it && r.end.IsZero() {
			return true
		}
	}
	return false
}

// deadLog records the dead letters the dead-letter activity got.
type deadLog struct {
	changed changes
	mu      sync.Mutex
	list    []temporalretry.DeadLetter
}

func (d *deadLog) add(dl temporalretry.DeadLetter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list = append(d.list, dl)
	d.changed.poke()
}

func (d *deadLog) ids() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string]bool{}
	for _, dl := range d.list {
		m[dl.ID] = true
	}
	return m
}

// sent counts the attempts that sent a request in a chain's JSON record.
func sent(t *testing.T, data json.RawMessage) int {
	t.Helper()
	n := 0
	for _, a := range decodeRecord(t, data).Attempts {
		if !a.Skipped {
			n++
		}
	}
	return n
}

// waitFor waits until cond holds, checking it whenever a log changes,
// or fails the test after d, saying what it waited for.
func waitFor(t *testing.T, c changes, d time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for !cond() {
		select {
		case <-c:
		case <-timeout.C:
			t.Fatalf("after %v, still waiting for %s", d, what)
		}
	}
}
