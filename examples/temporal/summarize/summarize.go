// Package summarize is the workflow, the activities and the chain that the
// worker and the starter of examples/temporal share: a workflow that
// summarizes items, one activity per item, each running an llmretry.Chain
// through temporalretry.Do, and the dead-letter path for the items that
// fail for good.
package summarize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/temporalretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// TaskQueue is the task queue the worker polls and the starter uses by
// default.
const TaskQueue = "llmretry-summarize"

// Item is one piece of work. Its ID names the item's model on the scripted
// provider, so what an item meets is the same on every worker.
type Item struct {
	ID string `json:"id"`
}

// Summary is what the workflow returns: the items done, with their
// answers, and the dead letters.
type Summary struct {
	Done map[string]string          `json:"done"`
	Dead []temporalretry.DeadLetter `json:"dead"`
}

// Options are the items' activity options, chosen with the chain's
// policies: a run may take a minute, the chain's deadline, and must
// heartbeat every 10s, which its waits and its stream's progress do; a
// failed run is run again after a second, three runs in all, unless its
// error says not to or a provider said when.
var Options = workflow.ActivityOptions{
	StartToCloseTimeout: time.Minute,
	HeartbeatTimeout:    10 * time.Second,
	RetryPolicy: &temporal.RetryPolicy{
		InitialInterval:    time.Second,
		BackoffCoefficient: 2,
		MaximumAttempts:    3,
	},
}

// Workflow summarizes items, all at once, and routes each item that failed
// for good to the dead-letter activity with its records: the dead-letter
// path of temporalretry.DeadLetterOf.
func Workflow(ctx workflow.Context, items []Item) (Summary, error) {
	ctx = workflow.WithActivityOptions(ctx, Options)
	sum := Summary{Done: map[string]string{}, Dead: []temporalretry.DeadLetter{}}
	var failed error
	wg := workflow.NewWaitGroup(ctx)
	for _, it := range items {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			var answer string
			err := workflow.ExecuteActivity(ctx, "summarize", it).Get(ctx, &answer)
			if dl, ok := temporalretry.DeadLetterOf(it.ID, err); ok {
				if err := workflow.ExecuteActivity(ctx, "dead_letter", dl).Get(ctx, nil); err != nil {
					failed = err
				}
				sum.Dead = append(sum.Dead, dl)
				return
			}
			if err != nil {
				failed = err // cancelled: the item was not run to its end
				return
			}
			sum.Done[it.ID] = answer
		})
	}
	wg.Wait(ctx)
	sort.Slice(sum.Dead, func(i, j int) bool { return sum.Dead[i].ID < sum.Dead[j].ID })
	return sum, failed
}

// Activities are the worker's activities: Summarize runs the chain, and
// DeadLetter writes each dead letter as a line of JSON, the format of
// batch.JSONLines.
type Activities struct {
	Chain *llmretry.Chain[Item, string] // the chain every item runs
	Dead  io.Writer                     // where the dead letters go
	Log   io.Writer                     // when not nil, gets a line for each failed run

	mu sync.Mutex // one line at a time, so lines stay whole
}

// Summarize asks the chain for the item's summary. Its error is the
// chain's, mapped for Temporal by temporalretry.Do.
func (a *Activities) Summarize(ctx context.Context, it Item) (string, error) {
	answer, err := temporalretry.Do(ctx, a.Chain, it)
	if err != nil && a.Log != nil {
		var app *temporal.ApplicationError
		if errors.As(err, &app) {
			next := "retryable"
			switch {
			case app.NonRetryable():
				next = "not retryable"
			case app.NextRetryDelay() > 0:
				next = "next run in " + app.NextRetryDelay().Round(100*time.Millisecond).String()
			}
			_ = a.write(a.Log, fmt.Sprintf("%s run %d: %s, %s\n", it.ID, activity.GetInfo(ctx).Attempt, app.Type(), next))
		}
	}
	return answer, err
}

// DeadLetter writes dl to a.Dead.
func (a *Activities) DeadLetter(_ context.Context, dl temporalretry.DeadLetter) error {
	line, err := json.Marshal(dl)
	if err != nil {
		return err
	}
	return a.write(a.Dead, string(line)+"\n")
}

// write writes line to w, one line at a time.
func (a *Activities) write(w io.Writer, line string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, err := io.WriteString(w, line)
	return err
}

// Register registers the workflow and the activities on w.
func Register(w worker.Registry, a *Activities) {
	w.RegisterWorkflowWithOptions(Workflow, workflow.RegisterOptions{Name: "summarize_items"})
	w.RegisterActivityWithOptions(a.Summarize, activity.RegisterOptions{Name: "summarize"})
	w.RegisterActivityWithOptions(a.DeadLetter, activity.RegisterOptions{Name: "dead_letter"})
}

// Start runs the workflow over items on task queue queue, as workflow
// id, and returns its summary.
func Start(ctx context.Context, c client.Client, queue, id string, items []Item) (Summary, error) {
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, "summarize_items", items)
	if err != nil {
		return Summary{}, err
	}
	var sum Summary
	err = run.Get(ctx, &sum)
	return sum, err
}

// Items returns n items, item-0 to item-(n-1).
func Items(n int) []Item {
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{ID: fmt.Sprintf("item-%d", i)}
	}
	return items
}

// Script scripts the provider for n items, as an outage: item i's
// behaviour is i mod 5 — answered; a 503 from both models, then answered
// by Temporal's next run; a 429 asking for 3s, which the next run waits
// for; a truncated answer on both models, which is dead at once; and 503
// for good, dead when the runs are used.
func Script(srv *llmretrytest.Server, n int) {
	limited := llmretrytest.Status(429).WithHeader("retry-after", "3")
	for i := range n {
		id := fmt.Sprintf("item-%d", i)
		answer := llmretrytest.Answer("The summary of " + id + ", streamed word by word.").Every(50 * time.Millisecond)
		switch i % 5 {
		case 0:
			srv.Script(id, answer)
		case 1:
			srv.Script(id, llmretrytest.Status(503), llmretrytest.Status(503), answer)
			srv.Script(id+"-mini", llmretrytest.Status(503))
		case 2:
			srv.Script(id, limited, answer)
			srv.Script(id+"-mini", limited)
		case 3:
			srv.Script(id, llmretrytest.Truncated("The summary of "+id+" was cut"))
			srv.Script(id+"-mini", llmretrytest.Truncated("The summary of "+id+" was cut again"))
		case 4:
			srv.Script(id, llmretrytest.Status(503))
			srv.Script(id+"-mini", llmretrytest.Status(503))
		}
	}
}

// NewChain returns the chain each item runs: the item's model, then its
// "-mini" model, on the OpenAI-compatible provider at baseURL. Each is
// tried twice, 100ms apart; a provider that asks for more than 2s is not
// waited for inside the run, whose error then carries the advice for
// Temporal's next run. The reserve is 5s of the run's minute, and
// MaxRawText is small, since the records travel in heartbeats and errors.
func NewChain(baseURL string) *llmretry.Chain[Item, string] {
	policy := llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond}, MaxTries: 2, MaxWait: 2 * time.Second, Reserve: 5 * time.Second}
	return &llmretry.Chain[Item, string]{
		Backends: []llmretry.Backend[Item, string]{
			{Model: "gpt-4o", Call: chat(baseURL, ""), Retry: policy, StallTimeout: 5 * time.Second},
			{Model: "gpt-4o-mini", Call: chat(baseURL, "-mini"), Retry: policy, StallTimeout: 5 * time.Second},
		},
		MaxRawText: 4 << 10,
	}
}

// chat returns a backend call that streams a chat completion of the
// item's model (with suffix) with plain net/http, and answers with the
// whole text. Each chunk is progress (llmretry.Progress): it restarts the
// stall timer and makes the activity heartbeat, and since the activity
// returns the text whole, a stream cut halfway may be sent again.
func chat(baseURL, suffix string) func(ctx context.Context, it Item) (string, error) {
	return func(ctx context.Context, it Item) (string, error) {
		body, err := json.Marshal(map[string]any{
			"model":    it.ID + suffix,
			"stream":   true,
			"messages": []map[string]string{{"role": "user", "content": "Summarize " + it.ID + "."}},
		})
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"chat/completions", strings.NewReader(string(body)))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err // llmretry.Classify knows refused and dropped connections
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(strings.TrimSpace(string(msg))))
		}
		return readStream(ctx, resp.Body)
	}
}
