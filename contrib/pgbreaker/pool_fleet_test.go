package pgbreaker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

// poolWorkerVar, set to a worker's number, makes TestMain run the pool's
// worker (runPoolWorker); it reads baseVar and dbVar as the fleet's does.
const poolWorkerVar = "PGBREAKER_POOL_WORKER"

// The pool's script: poolN worker processes, each sending poolRate calls
// a second for poolFor, each call with poolDeadline. The calls arrive as
// independent callers' do, at random (a Poisson process, seeded by the
// worker's number, so that every run plays the same arrivals), not on a clock
// that would spread them evenly: the load comes in clumps, and each
// process alone cannot tell the other's.
const (
	poolN        = 2
	poolRate     = 19 // a worker's calls a second: with poolN, 95% of the 40 the deployments take together
	poolFor      = 8 * time.Second
	poolCalls    = int(poolRate * poolFor / time.Second) // a worker's
	poolDeadline = 10 * time.Second
	poolModel    = "gpt-4o" // the pool's backend's Model
)

// poolDeployments are the pool's two deployments, each a model of the
// test server behind buckets of its own. An answer ("ok") costs 11
// tokens (10 in, 1 out): east takes 20 requests a second, its requests'
// bucket the tighter; west takes 20 too, by its tokens' bucket (220 a
// second), though its requests' would let 40 through.
var poolDeployments = []struct {
	name, model string
	limits      llmretrytest.Limits
}{
	{"east", "gpt-4o-east", llmretrytest.Limits{
		Requests: llmretrytest.Bucket{Rate: 20, Burst: 10},
		Tokens:   llmretrytest.Bucket{Rate: 330, Burst: 165},
	}},
	{"west", "gpt-4o-west", llmretrytest.Limits{
		Requests: llmretrytest.Bucket{Rate: 40, Burst: 20},
		Tokens:   llmretrytest.Bucket{Rate: 220, Burst: 110},
	}},
}

// poolEstimate is what a deployment's Estimate says each request will
// use: the 10 input tokens the server counts, and an output budget of 4,
// of which the answer uses 1, as a request's max tokens would.
var poolEstimate = llmretry.Usage{InputTokens: 10, OutputTokens: 4}

// poolRecord is what a pool worker writes to stdout for each attempt of
// its calls, and for each call's end, one JSON object a line.
type poolRecord struct {
	Worker     string `json:"worker"`
	Call       int    `json:"call"`
	ID         string `json:"id,omitempty"` // the request's X-Fleet-Request header; "" for a skip
	Deployment string `json:"deployment,omitempty"`
	Chosen     string `json:"chosen,omitempty"`
	Status     int    `json:"status"`
	Skipped    bool   `json:"skipped,omitempty"`
	Why        string `json:"why,omitempty"`
	// Done is set on the last record of a call: what Do returned.
	Done     bool   `json:"done,omitempty"`
	Answered bool   `json:"answered,omitempty"`
	Err      string `json:"err,omitempty"`
}

// runPoolWorker is one pool worker process: a chain whose one backend is
// a pool of poolDeployments, each deployment's Breaker on this package's
// store under a key of its own. It says "ready", waits for the start on
// stdin, sends its calls at poolRate and prints a record per attempt.
func runPoolWorker(id string) error {
	base := os.Getenv(baseVar)
	db, err := pgxpool.New(context.Background(), os.Getenv(dbVar)+"&pool_max_conns=16&pool_min_conns=4")
	if err != nil {
		return err
	}
	defer db.Close()
	store := pgbreaker.New(db) // one store per process serves every Breaker
	defer store.Close()
	client := &http.Client{Transport: &http.Transport{}}
	deployments := make([]llmretry.Deployment[string, string], len(poolDeployments))
	for i, d := range poolDeployments {
		deployments[i] = llmretry.Deployment[string, string]{Name: d.name, Backend: llmretry.Backend[string, string]{
			Model:    d.model,
			Call:     poolCall(client, base, d.model),
			Breaker:  &llmretry.Breaker{Key: "pool-" + d.name, Store: store, StoreTimeout: fleetStoreTimeout},
			Estimate: func(string) llmretry.Usage { return poolEstimate },
		}}
	}
	var (
		outMu sync.Mutex
		out   = json.NewEncoder(os.Stdout)
	)
	emit := func(r poolRecord) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(r)
	}
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{{Model: poolModel, Pool: deployments, Retry: callersPolicy}},
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
			n := ctx.Value(sendsKey{}).(*callSends)
			r := poolRecord{Worker: id, Call: n.call, Deployment: a.Deployment, Chosen: string(a.Chosen), Status: a.Status, Skipped: a.Skipped, Why: string(a.Why)}
			if !a.Skipped {
				r.ID = n.last()
			}
			emit(r)
		},
	}

	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the start: %w", err)
	}
	startNanos, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return fmt.Errorf("reading the start: %w", err)
	}
	start := time.Unix(0, startNanos)
	num, _ := strconv.Atoi(id)
	var (
		wg     sync.WaitGroup
		callNo atomic.Int64
		rng    = rand.New(rand.NewPCG(uint64(num), 0))
		off    time.Duration // the next call's, from the start
	)
	for range poolCalls {
		off += time.Duration(rng.ExpFloat64() * float64(time.Second) / poolRate)
		time.Sleep(time.Until(start.Add(off))) // the script's clock: real time, by design
		wg.Go(func() {
			n := &callSends{worker: id, call: int(callNo.Add(1))}
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), sendsKey{}, n), poolDeadline)
			defer cancel()
			_, err := chain.Do(ctx, "hi")
			r := poolRecord{Worker: id, Call: n.call, Done: true, Answered: err == nil}
			if err != nil {
				r.Err = strings.SplitN(err.Error(), "\n", 2)[0]
			}
			emit(r)
		})
	}
	wg.Wait()
	return nil
}

// poolCall is a deployment's Call: a chat completion of model from the
// test server at base, marked with the request's id, that reports the
// response's rate-limit headers and the answer's usage, as the adapters
// do.
func poolCall(client *http.Client, base, model string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, _ string) (string, error) {
		n := ctx.Value(sendsKey{}).(*callSends)
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"chat/completions", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Fleet-Request", n.next())
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		llmretry.ReportLimits(ctx, resp.Header)
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		var answer struct {
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &answer); err != nil {
			return "", llmretry.ParseFailure(string(b), err)
		}
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: answer.Usage.PromptTokens, OutputTokens: answer.Usage.CompletionTokens})
		return string(b), nil
	}
}

// Two worker processes, each with a chain whose one backend is a Pool of
// two deployments behind buckets of their own, share the deployments'
// state through PostgreSQL, each deployment's Breaker under its own key,
// while they send 95% of what the two deployments take together: at most
// 1% of the requests draw a 429, every call is answered, both
// deployments serve a fair share, and every request's record names the
// deployment whose model the server logged it for, with the status it
// played.
func TestPoolFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("plays the pool's script in real time, some 10 s")
	}
	db := freshSchema(t, pgURL(t), "pgbreaker_pool")
	if err := pgbreaker.Migrate(t.Context(), newPool(t, db)); err != nil {
		t.Fatalf("Migrate() = %v", err)
	}
	srv := llmretrytest.NewServer()
	defer srv.Close()
	modelOf := make(map[string]string) // a deployment's model
	for _, d := range poolDeployments {
		srv.Script(d.model, llmretrytest.Answer("ok"))
		srv.Limit(d.model, d.limits)
		modelOf[d.name] = d.model
	}
	workers, _ := startWorkers(t, poolN, func(i int) []string {
		return []string{poolWorkerVar + "=" + strconv.Itoa(i), baseVar + "=" + srv.OpenAIBaseURL(), dbVar + "=" + db}
	})
	records := readWorkers[poolRecord](t, workers)
	log := srv.Requests()

	logged := make(map[string]llmretrytest.Request, len(log))
	var (
		rateLimited int
		answers     = make(map[string]int) // by model
		requests    = make(map[string]int)
	)
	for _, r := range log {
		id := r.Header.Get("X-Fleet-Request")
		if _, dup := logged[id]; dup || id == "" {
			t.Errorf("server log: request %d has X-Fleet-Request %q, want a new one", r.N, id)
		}
		logged[id] = r
		requests[r.Model]++
		switch {
		case strings.HasPrefix(r.Step, "status 429"):
			rateLimited++
		case r.Step == "answer":
			answers[r.Model]++
		}
	}
	var (
		sent, calls, answered int
		chosen                = make(map[string]int) // deployment:why
		unanswered            = make(map[string]int) // by error
	)
	for _, r := range records {
		switch {
		case r.Done:
			calls++
			if r.Answered {
				answered++
			} else {
				unanswered[r.Err]++
			}
			continue
		case r.Skipped:
			// A wait for a deployment's breaker, or a skip: no request.
			chosen[r.Deployment+":"+r.Why]++
			continue
		}
		sent++
		chosen[r.Deployment+":"+r.Chosen]++
		l, ok := logged[r.ID]
		if !ok {
			t.Errorf("record %+v: request %s is not in the server's log", r, r.ID)
			continue
		}
		if want := modelOf[r.Deployment]; l.Model != want {
			t.Errorf("record of %s: deployment %q, whose model is %q; the server logged it for %q", r.ID, r.Deployment, want, l.Model)
		}
		if want := stepStatus(l.Step); r.Status != want {
			t.Errorf("record of %s: Status = %d, want %d (the server played %q)", r.ID, r.Status, want, l.Step)
		}
	}
	t.Logf("%d calls, %d answered; %d requests sent, %d drew a 429 (%.1f%%); requests by model %v, answers %v; records by deployment and why %v",
		calls, answered, len(log), rateLimited, 100*float64(rateLimited)/float64(len(log)), requests, answers, chosen)
	for err, n := range unanswered {
		t.Logf("%d calls: %s", n, err)
	}
	if sent != len(log) {
		t.Errorf("workers recorded %d requests sent, the server logged %d", sent, len(log))
	}
	if rateLimited*100 > len(log) {
		t.Errorf("%d of %d requests drew a 429, want at most 1%%", rateLimited, len(log))
	}
	if want := poolN * poolCalls; calls != want || answered != calls {
		t.Errorf("%d of %d calls answered, want all %d", answered, calls, want)
	}
	// The deployments take the same share: each must serve a fair part
	// of it, not only the other's spillover.
	for _, d := range poolDeployments {
		if n := answers[d.model]; n*4 < answered {
			t.Errorf("deployment %s answered %d of %d calls, want at least a quarter", d.name, n, answered)
		}
	}
}
