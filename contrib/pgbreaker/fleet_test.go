package pgbreaker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/pgbreaker"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The fleet tests re-execute their own test binary as each worker
// process: with workerVar (or poolWorkerVar) set, TestMain runs the
// worker instead of the tests.
const (
	workerVar = "PGBREAKER_FLEET_WORKER" // the worker's number; unset in the parent
	baseVar   = "PGBREAKER_FLEET_BASE"   // the test server's OpenAI base URL
	storeVar  = "PGBREAKER_FLEET_STORE"  // "pg": the shared store; "pg-default": the same at the default StoreTimeout; "local": one that shares nothing
	dbVar     = "PGBREAKER_FLEET_DB"     // the database URL, with the test's schema
	// With callersVar set, a worker plays the callers' script instead:
	// after the warm-up, so many callers at once, each making callsVar
	// calls one after another.
	callersVar = "PGBREAKER_FLEET_CALLERS"
	callsVar   = "PGBREAKER_FLEET_CALLS"
)

func TestMain(m *testing.M) {
	for _, w := range []struct {
		env string
		run func(id string) error
	}{{workerVar, runWorker}, {poolWorkerVar, runPoolWorker}} {
		if id := os.Getenv(w.env); id != "" {
			if err := w.run(id); err != nil {
				fmt.Fprintln(os.Stderr, "worker", id+":", err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// The fleet's script, in offsets from the start the parent hands every
// worker. The times are far enough apart that no phase spills into the
// next, and no assertion depends on them.
const (
	fleetN        = 4                       // worker processes
	model         = "gpt-4o"                // the one deployment, and its breaker key
	warmAt        = 0                       // one call per worker, so the breaker has a report before the burst
	burstAt       = 1500 * time.Millisecond // burstCalls calls per worker at once
	burstCalls    = 5
	outageStart   = 7 * time.Second // the parent scripts 503s from here...
	outageEnd     = 11 * time.Second
	steadyFrom    = 7 * time.Second // ...while each worker makes a call every steadyEvery
	steadyUntil   = 13 * time.Second
	steadyEvery   = 250 * time.Millisecond
	fleetFailures = 2           // the breaker's Failures
	fleetCooldown = time.Second // and Cooldown
	// The bound on a decision's store calls in TestFleet. The default is
	// for a database that is not shared with the test's own load: on
	// this 2-core machine, with the four workers and their server under
	// -race and other builds beside them, a burst of 40 calls' decisions
	// on one row timed out by the hundred at 50 ms (the default then),
	// and by the dozen at 500 ms with 20 calls, with a store that made a
	// statement per call; each such decision is the process's alone.
	// TestFleetCallers keeps the default.
	fleetStoreTimeout = time.Second
)

// limits is the provider's bucket: 8 requests, one more each 125 ms. The
// warm-up's 4 fit, and the burst of 20 (5 a worker: at 10 a worker, -race on this machine made
// the store the bottleneck, see fleetStoreTimeout) takes some 2 s to drain.
var limits = llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 8, Burst: 8}}

// record is what a worker writes to stdout for each attempt of its calls,
// one JSON object a line.
type record struct {
	Worker  string `json:"worker"`
	Phase   string `json:"phase"`
	Call    int    `json:"call"`
	ID      string `json:"id,omitempty"` // the request's X-Fleet-Request header; "" for a skip
	Status  int    `json:"status"`
	Skipped bool   `json:"skipped"`
	Why     string `json:"why,omitempty"`
	// Done is set on the last record of a call: what Do returned.
	Done     bool   `json:"done,omitempty"`
	Answered bool   `json:"answered,omitempty"`
	Err      string `json:"err,omitempty"`
	// StoreErrors is set on a worker's last line: its Breaker's count of
	// store calls that failed, each a decision taken alone.
	StoreErrors int64 `json:"store_errors,omitempty"`
	Final       bool  `json:"final,omitempty"`
	Loads       int64 `json:"loads,omitempty"` // with Final: the store calls the worker made
	Swaps       int64 `json:"swaps,omitempty"`
	Watches     int64 `json:"watches,omitempty"`
}

// sendsKey is the context key of a call's count of requests sent.
type sendsKey struct{}

// runWorker is one worker process: it builds its Breaker on the store
// storeVar names, says "ready", waits for the start on stdin, plays the
// script and prints a record per attempt.
func runWorker(id string) error {
	base := os.Getenv(baseVar)
	b, closeStore, err := workerBreaker(os.Getenv(storeVar), os.Getenv(dbVar))
	if err != nil {
		return err
	}
	defer closeStore()
	client := &http.Client{Transport: &http.Transport{}}
	call := func(ctx context.Context, _ string) (string, error) {
		n := ctx.Value(sendsKey{}).(*callSends)
		reqID := n.next()
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"chat/completions", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Fleet-Request", reqID)
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		llmretry.ReportLimits(ctx, resp.Header)
		body2, err := io.ReadAll(resp.Body)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		return string(body2), nil
	}
	var (
		outMu sync.Mutex
		out   = json.NewEncoder(os.Stdout)
	)
	emit := func(r record) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(r)
	}
	newChain := func(phase string, retry llmretry.Policy) *llmretry.Chain[string, string] {
		return &llmretry.Chain[string, string]{
			Backends: []llmretry.Backend[string, string]{{Model: model, Call: call, Retry: retry, Breaker: b}},
			OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
				n := ctx.Value(sendsKey{}).(*callSends)
				r := record{Worker: id, Phase: phase, Call: n.call, Status: a.Status, Skipped: a.Skipped, Why: string(a.Why)}
				if !a.Skipped {
					r.ID = n.last()
				}
				emit(r)
			},
		}
	}
	// The burst retries a 429 as the provider asks; a call in the outage
	// makes one attempt, so that what reaches the server is the
	// breaker's doing, not the policy's.
	burst := newChain("burst", llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}, MaxWait: 5 * time.Second, Reserve: -1})
	steady := newChain("steady", llmretry.Policy{})

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

	var (
		wg     sync.WaitGroup
		callNo atomic.Int64
	)
	// call1 makes one call of the chain c, and records what Do returned.
	call1 := func(c *llmretry.Chain[string, string], phase string, deadline time.Duration) {
		n := &callSends{worker: id, call: int(callNo.Add(1))}
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), sendsKey{}, n), deadline)
		defer cancel()
		_, err := c.Do(ctx, "hi")
		r := record{Worker: id, Phase: phase, Call: n.call, Done: true, Answered: err == nil}
		if err != nil {
			r.Err = strings.SplitN(err.Error(), "\n", 2)[0]
		}
		emit(r)
	}
	do := func(c *llmretry.Chain[string, string], phase string, deadline time.Duration) {
		wg.Go(func() { call1(c, phase, deadline) })
	}
	at := func(off time.Duration) { time.Sleep(time.Until(start.Add(off))) } // the script's clock: real time, by design
	at(warmAt)
	do(burst, "warm", 5*time.Second)
	if callers, _ := strconv.Atoi(os.Getenv(callersVar)); callers > 0 {
		// The callers' script: each caller calls again as soon as its
		// call is done, so that the process has that many calls at
		// once, in flight or waiting, until the last few.
		calls, _ := strconv.Atoi(os.Getenv(callsVar))
		queued := newChain("callers", callersPolicy)
		at(burstAt)
		for range callers {
			wg.Go(func() {
				for range calls {
					call1(queued, "callers", callersDeadline)
				}
			})
		}
	} else {
		at(burstAt)
		for range burstCalls {
			do(burst, "burst", 5*time.Second)
		}
		// The workers take turns through each steadyEvery, so that the
		// fleet's calls in the outage are spread out rather than sent
		// four at a time: four at once would all be in flight before
		// the first failure opened the breaker, whatever it shares.
		num, _ := strconv.Atoi(id)
		stagger := time.Duration(num-1) * steadyEvery / fleetN
		for off := steadyFrom + stagger; off < steadyUntil; off += steadyEvery {
			at(off)
			do(steady, "steady", 200*time.Millisecond)
		}
	}
	wg.Wait()
	st := b.State()
	cs := b.Store.(*countingStore)
	emit(record{Worker: id, Final: true, StoreErrors: st.StoreErrors, Err: fmt.Sprint(st.StoreErr), Loads: cs.loads.Load(), Swaps: cs.swaps.Load(), Watches: cs.watches.Load()})
	return nil
}

// callSends numbers the requests of one call, so that each record can
// name the request it stands for in the server's log.
type callSends struct {
	worker string
	call   int
	mu     sync.Mutex
	n      int
}

func (c *callSends) next() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return fmt.Sprintf("w%s-c%d-r%d", c.worker, c.call, c.n)
}

func (c *callSends) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("w%s-c%d-r%d", c.worker, c.call, c.n)
}

// fleetRun is what one run of the fleet saw.
type fleetRun struct {
	records []record
	log     []llmretrytest.Request
}

// fleetConfig is what a run of the fleet plays.
type fleetConfig struct {
	store string // storeVar: "pg", "pg-default" or "local"
	db    string // the database URL, with the test's schema
	// callers, when set, plays the callers' script, with so many
	// callers per worker, each making calls calls, against the bucket
	// callersLimits; otherwise the burst and the outage, against limits.
	callers, calls int
}

// runFleet starts the test server and fleetN worker processes as fc
// says, plays the script, and returns every record and the server's
// log.
func runFleet(t *testing.T, fc fleetConfig) fleetRun {
	t.Helper()
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script(model, llmretrytest.Answer("ok"))
	if fc.callers > 0 {
		srv.Limit(model, callersLimits)
	} else {
		srv.Limit(model, limits)
	}
	workers, start := startWorkers(t, fleetN, func(i int) []string {
		return []string{workerVar + "=" + strconv.Itoa(i), baseVar + "=" + srv.OpenAIBaseURL(), storeVar + "=" + fc.store, dbVar + "=" + fc.db,
			callersVar + "=" + strconv.Itoa(fc.callers), callsVar + "=" + strconv.Itoa(fc.calls)}
	})
	if fc.callers == 0 {
		// The outage, on the parent's clock: the server answers 503 to
		// every request between these two times.
		outage := time.AfterFunc(time.Until(start.Add(outageStart)), func() { srv.Script(model, llmretrytest.Status(http.StatusServiceUnavailable)) })
		defer outage.Stop()
		recovery := time.AfterFunc(time.Until(start.Add(outageEnd)), func() { srv.Script(model, llmretrytest.Answer("ok")) })
		defer recovery.Stop()
	}
	run := fleetRun{records: readWorkers[record](t, workers)}
	run.log = srv.Requests()
	return run
}

// fleetCounts is what the server's log says the fleet drew.
type fleetCounts struct {
	Sent        int   // requests in the server's log
	RateLimited int   // of them, refused by the bucket with a 429
	Outage      int   // of them, answered 503 during the outage: the failures that opened the breaker, and the probes
	BurstCalls  int   // calls of the warm-up and the burst, or of the callers
	Answered    int   // of them, answered
	StoreErrors int64 // store calls that failed, over the fleet
	Loads       int64 // store calls, over the fleet
	Swaps       int64
	Watches     int64
}

// countFleet counts the run, and checks it against the server's log: every
// request the workers recorded as sent is in the log, with the status the
// record has, and the log holds nothing they did not record.
func countFleet(t *testing.T, run fleetRun) fleetCounts {
	t.Helper()
	var c fleetCounts
	logged := make(map[string]llmretrytest.Request, len(run.log))
	for _, r := range run.log {
		id := r.Header.Get("X-Fleet-Request")
		if _, dup := logged[id]; dup || id == "" {
			t.Errorf("server log: request %d has X-Fleet-Request %q, want a new one", r.N, id)
		}
		logged[id] = r
		c.Sent++
		switch {
		case strings.HasPrefix(r.Step, "status 429"):
			c.RateLimited++
		case r.Step == "status 503":
			c.Outage++
		}
	}
	recorded := 0
	for _, r := range run.records {
		switch {
		case r.Final:
			c.StoreErrors += r.StoreErrors
			c.Loads += r.Loads
			c.Swaps += r.Swaps
			c.Watches += r.Watches
			if r.StoreErrors > 0 {
				t.Logf("worker %s: %d store errors, the last: %s", r.Worker, r.StoreErrors, r.Err)
			}
			continue
		case r.Done:
			if r.Phase != "steady" {
				c.BurstCalls++
				if r.Answered {
					c.Answered++
				}
			}
			continue
		case r.Skipped:
			continue
		}
		recorded++
		l, ok := logged[r.ID]
		if !ok {
			t.Errorf("record %+v: request %s is not in the server's log", r, r.ID)
			continue
		}
		if want := stepStatus(l.Step); r.Status != want {
			t.Errorf("record of %s: Status = %d, want %d (the server played %q)", r.ID, r.Status, want, l.Step)
		}
	}
	if recorded != len(run.log) {
		t.Errorf("workers recorded %d requests sent, the server logged %d", recorded, len(run.log))
	}
	return c
}

// stepStatus is the Status an attempt record has for a request on which
// the server played step: 0 for an answer, as a success records no status.
func stepStatus(step string) int {
	if step == "answer" {
		return 0
	}
	var code int
	if _, err := fmt.Sscanf(step, "status %d", &code); err != nil {
		return -1
	}
	return code
}

// Bounds on what the fleet draws with a shared store. The burst's 20
// calls against a bucket of 8 draw a 429 only from a report that is
// late to the store, or a decision a slow store left to one process
// (the bar for the simulated fleet is 10 in all); the outage
// opens the breaker after fleetFailures failures, and then one probe
// goes out per cooldown across the fleet, where a Breaker per process
// draws fleetN times that.
const (
	maxRateLimited = 10
	maxOutage      = fleetFailures + int((outageEnd-outageStart)/fleetCooldown) + 1
)

// Four worker processes share one breaker through PostgreSQL: the
// fleet draws at most a handful of 429s from a bucket smaller than its
// burst, and in an outage sends one probe per cooldown, not one per
// process. The same fleet on stores that share nothing breaks both
// bounds, which shows that the test can tell. Every request a worker
// recorded as sent is in the server's log with the status recorded, and
// the log holds no other.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("plays the fleet's script in real time, some 15 s per run")
	}
	url := freshSchema(t, pgURL(t), "pgbreaker_fleet")
	if err := pgbreaker.Migrate(t.Context(), newPool(t, url)); err != nil {
		t.Fatalf("Migrate() = %v", err)
	}
	t.Run("shared", func(t *testing.T) {
		run := runFleet(t, fleetConfig{store: "pg", db: url})
		c := countFleet(t, run)
		t.Logf("shared store: %+v; store calls per request sent: %.1f loads, %.1f swaps", c,
			float64(c.Loads)/float64(c.Sent), float64(c.Swaps)/float64(c.Sent))
		for _, r := range run.records {
			if r.Done && !r.Answered && r.Phase != "steady" {
				t.Logf("worker %s call %d (%s): %s", r.Worker, r.Call, r.Phase, r.Err)
			}
		}
		if c.RateLimited > maxRateLimited || c.Outage > maxOutage {
			t.Errorf("429s %d, outage requests %d; want at most %d, %d", c.RateLimited, c.Outage, maxRateLimited, maxOutage)
		}
		// Not a bound of this test, but worth seeing: in about one run
		// in four, a few calls of the burst waited, paced, past their
		// 5 s deadline though the bucket drains in some 2 s.
		if c.Answered != c.BurstCalls {
			t.Logf("answered %d of %d calls of the burst", c.Answered, c.BurstCalls)
		}
	})
	t.Run("shares_nothing", func(t *testing.T) {
		c := countFleet(t, runFleet(t, fleetConfig{store: "local"}))
		t.Logf("a store per process: %+v", c)
		if c.RateLimited <= maxRateLimited || c.Outage <= maxOutage {
			t.Errorf("429s %d, outage requests %d; want more than %d, %d: without sharing, each process learns alone", c.RateLimited, c.Outage, maxRateLimited, maxOutage)
		}
	})
}

// The callers' script: the fleet's calls queue for a bucket far smaller
// than what they ask, so that most of them wait, paced, in the fleet's
// line. Each worker makes callsPerWorker calls in all, from 10 or from
// 100 callers at once, so that the two runs send the same requests and
// differ only in how many calls wait at a time.
const (
	callsPerWorker  = 200
	callersDeadline = time.Minute // far more than the line takes to drain (some 8 s)
)

// callersLimits is the provider's bucket in the callers' script: 100
// requests a second, 20 at once. The warm-up's 4 fit; the fleet's 800
// then take some 8 s.
var callersLimits = llmretrytest.Limits{Requests: llmretrytest.Bucket{Rate: 100, Burst: 20}}

// callersPolicy retries a 429 as the provider asks, and bounds a wait in
// line by the deadline alone, so that a call is never given up for
// waiting its turn.
var callersPolicy = llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}, MaxWait: 30 * time.Second, Reserve: -1}

// Four worker processes with many callers each share one breaker through
// PostgreSQL, with the Breaker's StoreTimeout at its default: at 100
// callers a worker as at 10, every call is answered, at most 1% of the
// requests sent draw a 429, and the store's loads per request sent at
// 100 callers are at most 3× those at 10: what a request costs the store
// does not grow with the calls waiting.
func TestFleetCallers(t *testing.T) {
	if testing.Short() {
		t.Skip("plays the callers' script in real time, some 10 s per run")
	}
	url := pgURL(t)
	perSent := make(map[int]float64)
	for _, callers := range []int{10, 100} {
		t.Run(fmt.Sprintf("callers_%d", callers), func(t *testing.T) {
			db := freshSchema(t, url, fmt.Sprintf("pgbreaker_callers_%d", callers))
			if err := pgbreaker.Migrate(t.Context(), newPool(t, db)); err != nil {
				t.Fatalf("Migrate() = %v", err)
			}
			began := time.Now()
			run := runFleet(t, fleetConfig{store: "pg-default", db: db, callers: callers, calls: callsPerWorker / callers})
			took := time.Since(began)
			c := countFleet(t, run)
			sent := float64(c.Sent)
			perSent[callers] = float64(c.Loads) / sent
			t.Logf("%d workers × %d callers: %d requests sent in %v, %d drew 429 (%.1f%%); %d of %d calls answered; store calls per request sent: %.2f loads, %.2f swaps, %.2f watches; %d store errors",
				fleetN, callers, c.Sent, took.Round(time.Millisecond), c.RateLimited, 100*float64(c.RateLimited)/sent, c.Answered, c.BurstCalls,
				float64(c.Loads)/sent, float64(c.Swaps)/sent, float64(c.Watches)/sent, c.StoreErrors)
			unanswered := make(map[string]int)
			for _, r := range run.records {
				if r.Done && !r.Answered {
					unanswered[r.Err]++
				}
			}
			for err, n := range unanswered {
				t.Logf("%d calls: %s", n, err)
			}
			if c.RateLimited*100 > c.Sent {
				t.Errorf("%d of %d requests drew a 429, want at most 1%%", c.RateLimited, c.Sent)
			}
			// A fleet that stalls sends little and loads little: the
			// bounds per request sent hold only for one that works.
			if c.Answered != c.BurstCalls {
				t.Errorf("%d of %d calls answered, want all: the line drains in some 8 s, and each call has a minute", c.Answered, c.BurstCalls)
			}
		})
	}
	few, many := perSent[10], perSent[100]
	t.Logf("loads per request sent: %.2f at 10 callers a worker, %.2f at 100", few, many)
	// The notices carry the state, so a worker loads only now and then
	// (its first decision, a write that lost to one not yet noticed):
	// a few loads in a run, whose ratio is noise. Loads that grow with
	// the callers are many more than that.
	if many > 3*few && many > few+0.05 {
		t.Errorf("loads per request sent: %.2f at 100 callers a worker, more than 3× the %.2f at 10", many, few)
	}
}
