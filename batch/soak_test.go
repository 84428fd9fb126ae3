package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/llmretrytest"
)

var soakSeed = flag.Uint64("soak.seed", 0, "seed of TestSoak's faults and deadlines; 0 takes one from the clock")

// TestSoak sends 10,000 items through a Runner over a three-backend
// Chain, each backend a model on its own scripted server that fails in
// every way the servers can (rate limits with hints, 5xx, overloads,
// truncations, rejections, hangups, drops and stalls, slow answers), with
// breakers that open and close many times, per-run deadlines and
// cancellations, and the batch itself cancelled near its end. It checks
// that nothing is lost:
//
//  1. every item ends exactly once, answered, dead or not run;
//  2. the servers saw exactly the requests the chain recorded;
//  3. the heap after the batch is back where it was;
//  4. no goroutine is left behind;
//  5. no secret from the providers' URLs reaches a record.
//
// It logs its figures (go test -v shows them): outcomes, requests per
// model, attempts by kind, breaker openings and skips, and the chain's
// own time per attempt.
//
// The faults are seeded, so a failure can be replayed with -soak.seed, as
// far as real time allows: which request gets which step depends on the
// order in which concurrent requests reach a server.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test: skipped with -short")
	}
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -soak.seed=%d)", seed, seed)

	// A small batch first, so that what the packages set up once and keep
	// (encoding/json's per-type caches, net/http's and the race detector's
	// first-use state) is there before the heap is measured.
	soak(t, seed, 200)
	if t.Failed() {
		return
	}
	heapBefore := settledHeap()
	goroutinesBefore := runtime.NumGoroutine()

	f := soak(t, seed, soakItems)

	// 3. The heap after, with every server, client, record and error of
	// the batch unreachable, is within heapSlack of the heap before (see
	// heapSlack for the bound).
	heapAfter := settledHeap()
	f.heapBefore, f.heapAfter = heapBefore, heapAfter
	if heapAfter > heapBefore+heapSlack {
		t.Errorf("heap after the batch = %d bytes, want at most %d (before) + %d", heapAfter, heapBefore, heapSlack)
	}

	// 4. No goroutine is left: the chain's timers, the runner's workers,
	// the transport's connection loops and the servers' handlers have all
	// ended. Those on their way out get a bounded while to finish.
	f.goroutinesBefore = goroutinesBefore
	f.goroutinesAfter = settledGoroutines(goroutinesBefore)
	if f.goroutinesAfter > goroutinesBefore {
		t.Errorf("%d goroutines after the batch, want at most %d (before):\n%s", f.goroutinesAfter, goroutinesBefore, allStacks())
	}
	f.log(t)
}

const (
	soakItems       = 10000
	soakConcurrency = 64
	scriptSteps     = 40000 // per model; more than a batch asks for, and the last step (an answer) repeats
	// heapSlack is how much more live heap TestSoak allows after the
	// batch than before it. The runtime's own bookkeeping makes the two
	// differ by little (observed: 30 to 125 KiB, with and without the
	// race detector); 512 KiB is four times the most seen, and below what
	// a leak of one record or one cancel context per item would keep: an
	// Attempt is 160 bytes and a cancel context 80, so 10,000 of them are
	// 1.5 MiB and 780 KiB.
	heapSlack = 512 << 10
)

// The three backends, in chain order: two OpenAI models and one Anthropic
// model, each on a server of its own, so that each server's log is one
// backend's requests.
var soakModels = []struct {
	model, api string
	path       string // the endpoint, with the query that carries the key
	policy     llmretry.Policy
	timeout    time.Duration
	stall      time.Duration
	failures   int
	cooldown   time.Duration
}{
	{"gpt-soak-a", "openai", "/v1/chat/completions?api_key=sk-soak-%s", llmretry.Policy{
		Waits: []time.Duration{2 * time.Millisecond, 4 * time.Millisecond}, Reserve: 2 * time.Millisecond, MaxWait: 40 * time.Millisecond, Jitter: 0.5,
	}, 300 * soakScale * time.Millisecond, 150 * soakScale * time.Millisecond, 4, 15 * time.Millisecond},
	{"gpt-soak-b", "openai", "/v1/chat/completions?alt=json&key=%s", llmretry.Policy{
		Waits: []time.Duration{3 * time.Millisecond}, MaxWait: 40 * time.Millisecond,
	}, 250 * soakScale * time.Millisecond, 120 * soakScale * time.Millisecond, 3, 25 * time.Millisecond},
	{"claude-soak", "anthropic", "/v1/messages?token=%s", llmretry.Policy{
		Waits: []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond}, Reserve: 2 * time.Millisecond, MaxWait: 60 * time.Millisecond,
	}, 350 * soakScale * time.Millisecond, 150 * soakScale * time.Millisecond, 5, 10 * time.Millisecond},
}

// soakReq is one item's request. Every backend builds its own body from
// it.
type soakReq struct {
	ID     string
	Index  int
	Stream bool // ask for a stream: Delivered, and StallTimeout between chunks
	Doomed bool // every run gets a deadline of 1–3 ms, too short for most answers: most end dead
}

// soakAttempt is what the test keeps of a record the chain handed to
// OnAttempt: the key of the request it stands for,
// "<item>/<run>/<backend>/<try>", and how it went. (The records
// themselves are checked when their run ends, and dropped: kept for the
// whole batch, they would make the garbage collector, and so the batch,
// slow under the race detector.)
type soakAttempt struct {
	key       string
	skipped   bool
	kind      string        // "ok", or the Kind's name
	elapsed   time.Duration // the Call's time
	delivered bool          // it failed after handing output over
}

// soakCall is a request a backend's Call made, with the same key.
type soakCall struct {
	key     string
	backend int
	sent    bool // every byte of the request reached the socket
	wrote   bool // httptrace's WroteRequest reported it written, by the time Call returned
}

// runState is one run of one item: one Do of the inner chain. Call and
// OnAttempt both run on Do's goroutine, one after the other, so it needs
// no lock.
type runState struct {
	key     string // "<item>/<run>"
	last    llmretry.Attempt
	has     bool      // last is set
	prevEnd time.Time // when the chain's own time began: Do's start, or the last record's end plus its wait
	wrapped bool      // the plan has come back to a backend it skipped
	sent    []int     // requests recorded so far, per backend (skips are not requests)

	// What the run recorded. Kept here, not behind the soaker's lock, so
	// that other runs' appends cost this run's chain no time.
	records  []llmretry.Attempt // until the run ends
	keys     []string           // records[i]'s key
	attempts []soakAttempt
	calls    []soakCall
	gaps     [gapClasses][]time.Duration // the chain's overhead before each record, by class
}

type runKey struct{}

// errWithdrawn is the cause of a run's cancellation.
var errWithdrawn = errors.New("soak: the item was withdrawn")

// soaker is one batch's machinery and what it records.
type soaker struct {
	seed    uint64
	client  *http.Client
	inner   *llmretry.Chain[soakReq, string]
	runs    []atomic.Int32 // runs begun, by item index
	secrets []string       // planted in the URLs

	mu         sync.Mutex
	runStates  []*runState // every run's, once it has ended
	problems   []string    // found off the test's goroutine
	deadlines  int         // runs given a deadline
	cancels    int         // runs whose cancellation fired and that ended Cancelled
	rawSecrets int         // backend errors holding a planted secret
}

// problem records a failure found off the test's goroutine; the first
// few are reported in full.
func (s *soaker) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.problems) < 10 {
		s.problems = append(s.problems, fmt.Sprintf(format, args...))
	} else if len(s.problems) == 10 {
		s.problems = append(s.problems, "and more")
	}
}

// leaks reports a problem when text holds a planted secret.
func (s *soaker) leaks(what, text string) {
	for _, secret := range s.secrets {
		if strings.Contains(text, secret) {
			s.problem("%s holds the secret %q:\n%s", what, secret, text)
			return
		}
	}
}

// checkRun checks a finished run's records and error for secrets (check
// 5), and keeps only what the later checks need.
func (s *soaker) checkRun(rs *runState, err error) {
	raw := 0
	for i, a := range rs.records {
		if a.Err != nil && hasAny(a.Err.Error(), s.secrets) {
			raw++
		}
		s.leaks("Attempt.String", a.String())
		s.leaks("Attempt JSON", mustMarshal(s, a))
		kind := "ok"
		if a.Err != nil || a.Skipped {
			kind = a.Kind.String()
		}
		rs.attempts = append(rs.attempts, soakAttempt{key: rs.keys[i], skipped: a.Skipped, kind: kind, elapsed: a.Elapsed, delivered: a.Delivered && a.Err != nil})
	}
	rs.records, rs.keys = nil, nil
	if err != nil {
		// The JSON's "error" is the Error text.
		s.leaks("error JSON", mustMarshal(s, err))
		var b bytes.Buffer
		slog.New(slog.NewJSONHandler(&b, nil)).Error("soak", "err", err)
		s.leaks("error slog", b.String())
	}
	s.mu.Lock()
	s.rawSecrets += raw
	s.mu.Unlock()
}

// mustMarshal is v's JSON, or a problem.
func mustMarshal(s *soaker, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		s.problem("json.Marshal(%T) = %v", v, err)
	}
	return string(b)
}

// soakFigures are what one batch did, for the log.
type soakFigures struct {
	items                             int
	wall                              time.Duration
	counts                            batch.Counts
	requests                          []int // per model
	kinds                             map[string]int
	skips                             int
	opened                            []int // breaker openings per backend
	attempts, unsent, wroteUnsent     int
	delivered                         int // attempts that failed after delivering output
	deadlines, cancels                int
	gaps                              [gapClasses + 1]gapFigures // the last: bookkeeping and timer together
	lateness                          gapFigures                 // of a control timer
	answer50, answer99                time.Duration
	heapBefore, heapAfter             uint64
	goroutinesBefore, goroutinesAfter int
	secretsInRawErrors                int
}

func (f *soakFigures) log(t *testing.T) {
	t.Helper()
	t.Logf("items %d in %v (concurrency %d): answered %d, dead %d, not run %d",
		f.items, f.wall.Round(time.Millisecond), soakConcurrency, f.counts.Succeeded, f.counts.Dead, f.counts.NotRun)
	for i, m := range soakModels {
		t.Logf("model %-11s requests %5d, breaker opened %3d times", m.model, f.requests[i], f.opened[i])
	}
	kinds := slices.Sorted(maps.Keys(f.kinds))
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s %d", k, f.kinds[k])
	}
	t.Logf("attempts sent %d by kind:%s; failed after delivering output %d; skipped for breakers %d", f.attempts, b.String(), f.delivered, f.skips)
	t.Logf("time to an answer, per answered attempt: p50 %v, p99 %v", f.answer50, f.answer99)
	t.Logf("attempts whose request never reached the server: %d (of which httptrace's WroteRequest had reported written: %d)", f.unsent, f.wroteUnsent)
	t.Logf("runs with a deadline %d, runs withdrawn %d, batch cancelled with %d items not run", f.deadlines, f.cancels, f.counts.NotRun)
	t.Logf("chain overhead per record: p50 %v, p99 %v over %d (no breaker wait possible)", f.gaps[gapClasses].p50, f.gaps[gapClasses].p99, f.gaps[gapClasses].n)
	for c, name := range []string{"bookkeeping only", "after a retry's timer", "may hold a breaker wait"} {
		t.Logf("  %-23s p50 %v, p99 %v over %d", name+":", f.gaps[c].p50, f.gaps[c].p99, f.gaps[c].n)
	}
	t.Logf("  (a control 2ms timer fired late by p50 %v, p99 %v over %d)", f.lateness.p50, f.lateness.p99, f.lateness.n)
	t.Logf("raw errors holding a planted secret: %d; none in any record", f.secretsInRawErrors)
	t.Logf("heap %d bytes before, %d after (slack %d); goroutines %d before, %d after",
		f.heapBefore, f.heapAfter, heapSlack, f.goroutinesBefore, f.goroutinesAfter)
}

// soak runs one batch of n items and checks that nothing was lost
// (checks 1, 2 and 5; TestSoak makes 3 and 4 around it). Only the
// figures outlive it.
func soak(t *testing.T, seed uint64, n int) *soakFigures {
	rng := rand.New(rand.NewPCG(seed, 0))
	s := &soaker{seed: seed, runs: make([]atomic.Int32, n)}

	servers := make([]*llmretrytest.Server, len(soakModels))
	breakers := make([]*llmretry.Breaker, len(soakModels))
	backends := make([]llmretry.Backend[soakReq, string], len(soakModels))
	for i, m := range soakModels {
		srv := llmretrytest.NewServer()
		defer srv.Close() // at once when a check below stops the test; a second Close is harmless
		servers[i] = srv
		srv.Script(m.model, script(rand.New(rand.NewPCG(seed, uint64(1+i))), scriptSteps, n)...)
		// The secrets a record must never show: the password in the
		// URL's userinfo and the key in its query.
		pass, key := fmt.Sprintf("pw-soak-%016x", rng.Uint64()), fmt.Sprintf("%016x", rng.Uint64())
		s.secrets = append(s.secrets, pass, key)
		url := strings.Replace(srv.URL, "http://", "http://soak:"+pass+"@", 1) + fmt.Sprintf(m.path, key)
		breakers[i] = &llmretry.Breaker{Failures: m.failures, Cooldown: m.cooldown}
		backends[i] = llmretry.Backend[soakReq, string]{
			Model: m.model, Call: s.call(i, m.api, m.model, url), Retry: m.policy,
			Timeout: m.timeout, StallTimeout: m.stall, Breaker: breakers[i],
		}
	}
	transport := &http.Transport{
		// One request per connection, as the servers want anyway: each
		// connection then carries exactly the request that dialled it, and
		// what reached its socket is that request's bytes.
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &soakConn{Conn: c}, nil
		},
	}
	s.client = &http.Client{Transport: transport}
	defer transport.CloseIdleConnections()

	s.inner = &llmretry.Chain[soakReq, string]{Backends: backends, OnAttempt: s.onAttempt}
	// The Runner gives Do its own context for every item, so the per-run
	// deadlines and cancellations come from a chain around the chain: its
	// one backend, with no retries of its own (so the inner chain still
	// retries: it is not nested), gives each run its context.
	outer := &llmretry.Chain[soakReq, string]{Backends: []llmretry.Backend[soakReq, string]{{Model: "item", Call: s.run}}}

	reqs := make([]soakReq, n)
	for i := range reqs {
		reqs[i] = soakReq{ID: fmt.Sprintf("item-%05d", i), Index: i, Stream: rng.IntN(100) < 30, Doomed: rng.IntN(100) < 1}
	}

	var (
		answered, notRun []string
		dead             []batch.DeadLetter
		notRunErrs       []error
		deadLines        bytes.Buffer
	)
	lines := batch.JSONLines(&deadLines)
	r := &batch.Runner[soakReq, string]{
		Chain:       outer,
		Concurrency: soakConcurrency,
		Runs:        3,
		Waits:       []time.Duration{3 * time.Millisecond, 8 * time.Millisecond},
		// The Runner calls these one at a time, and returns after the last.
		OnResult: func(item batch.Item[soakReq], _ string) { answered = append(answered, item.ID) },
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			dead = append(dead, d)
			return lines.Put(d)
		}),
		OnNotRun: func(item batch.Item[soakReq], last error) {
			notRun = append(notRun, item.ID)
			if last != nil {
				notRunErrs = append(notRunErrs, last)
			}
		},
	}

	// The batch is cancelled a little after its last item was taken, so
	// that every item is taken (and counted) and some are still running or
	// waiting for another run: those end not run.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stopper *time.Timer
	endAfter := time.Duration(5+rng.IntN(25)) * time.Millisecond
	items := func(yield func(batch.Item[soakReq]) bool) {
		for _, req := range reqs {
			if !yield(batch.Item[soakReq]{ID: req.ID, Req: req}) {
				return
			}
		}
		stopper = time.AfterFunc(endAfter, cancel)
	}

	// A control: how late a plain 2ms timer fires meanwhile, on the same
	// loaded process, to read the chain's overhead after a retry's timer
	// against.
	var lateness []time.Duration
	ran, controlled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(controlled)
		for {
			const d = 2 * time.Millisecond
			begin := time.Now()
			timer := time.NewTimer(d)
			select {
			case <-ran:
				timer.Stop()
				return
			case <-timer.C:
				lateness = append(lateness, time.Since(begin)-d)
			}
		}
	}()

	start := time.Now()
	counts, err := r.Run(ctx, items)
	wall := time.Since(start)
	close(ran)
	<-controlled
	if stopper != nil {
		stopper.Stop()
	}
	switch {
	case counts.NotRun > 0 && !errors.Is(err, context.Canceled):
		t.Errorf("Run() = %v with %d items not run, want an error matching context.Canceled", err, counts.NotRun)
	case counts.NotRun == 0 && err != nil:
		t.Errorf("Run() = %v with every item run, want nil", err)
	}

	var (
		attempts []soakAttempt
		calls    []soakCall
		gaps     [gapClasses][]time.Duration
	)
	for _, rs := range s.runStates {
		attempts = append(attempts, rs.attempts...)
		calls = append(calls, rs.calls...)
		for c := range gaps {
			gaps[c] = append(gaps[c], rs.gaps[c]...)
		}
	}

	// Every request whose bytes reached a socket is read and logged by its
	// server, but perhaps only after its client gave up on it: wait for
	// them before Close cuts connections that the server has not read yet.
	sent := make([]int, len(soakModels))
	for _, c := range calls {
		if c.sent {
			sent[c.backend]++
		}
	}
	for i, srv := range servers {
		waitUntil(5*time.Second, func() bool { return len(srv.Requests()) >= sent[i] })
	}
	transport.CloseIdleConnections()
	logs := make([][]llmretrytest.Request, len(servers))
	for i, srv := range servers {
		srv.Close() // waits for every handler, so the log is complete
		logs[i] = srv.Requests()
	}

	f := &soakFigures{
		items: n, wall: wall, counts: counts, kinds: map[string]int{},
		deadlines: s.deadlines, cancels: s.cancels,
	}
	for i := range servers {
		f.requests = append(f.requests, len(logs[i]))
		f.opened = append(f.opened, breakers[i].State().Opened)
		if len(logs[i]) > scriptSteps {
			t.Errorf("model %s: %d requests played its script of %d steps and more: lengthen it", soakModels[i].model, len(logs[i]), scriptSteps)
		}
	}

	// 1. Every item is accounted for exactly once.
	checkEnds(t, reqs, counts, answered, dead, notRun)

	// 2. The servers saw exactly the requests that the chain recorded.
	answers := f.checkRequests(t, attempts, calls, logs)

	// 5. No secret from the URLs reaches a record: not the attempts'
	// String or JSON, not the errors' text, JSON or slog value (checked
	// as each run ends, by checkRun), not the dead letters. The errors the
	// backends returned do hold them (net/http puts the query in its
	// errors, and these Calls the whole URL), so there was something to
	// hide.
	f.secretsInRawErrors = s.rawSecrets
	if n == soakItems && f.secretsInRawErrors == 0 {
		t.Errorf("no backend error held a planted secret: the check proves nothing")
	}
	errs := notRunErrs
	for _, d := range dead {
		errs = append(errs, d.Err)
	}
	for _, err := range errs {
		s.leaks("the runner's error text", err.Error())
		s.leaks("the runner's error JSON", mustMarshal(s, err))
	}
	s.leaks("the dead-letter JSON lines", deadLines.String())
	if got := strings.Count(deadLines.String(), "\n"); got != len(dead) {
		t.Errorf("dead-letter JSON has %d lines, want %d", got, len(dead))
	}

	for _, p := range s.problems {
		t.Error(p)
	}

	// The chain's own time per attempt (see onAttempt).
	f.answer50, f.answer99 = percentile(answers, 50), percentile(answers, 99)
	for c := range gaps {
		f.gaps[c] = gapFiguresOf(gaps[c])
	}
	f.gaps[gapClasses] = gapFiguresOf(slices.Concat(gaps[gapBookkeeping], gaps[gapTimer]))
	f.lateness = gapFiguresOf(lateness)

	// The fault mix is meant to reach every outcome; a batch that does not
	// tests less than it claims.
	if n == soakItems {
		for what, got := range map[string]int{
			"answered": counts.Succeeded, "dead letters": counts.Dead, "items not run": counts.NotRun,
			"withdrawn runs": s.cancels, "unsent attempts": f.unsent, "skips": f.skips,
			"truncated attempts": f.kinds["truncated"], "timeouts": f.kinds["timeout"],
			"failures after delivery": f.delivered,
		} {
			if got == 0 {
				t.Errorf("the batch had no %s: tune the fault mix", what)
			}
		}
		for i, o := range f.opened {
			if o < 2 {
				t.Errorf("breaker of %s opened %d times, want several: tune the fault mix", soakModels[i].model, o)
			}
		}
	}
	return f
}

// checkEnds checks that every item ended exactly once, answered, dead or
// not run, and that the counts say the same (check 1).
func checkEnds(t *testing.T, reqs []soakReq, counts batch.Counts, answered []string, dead []batch.DeadLetter, notRun []string) {
	t.Helper()
	n := len(reqs)
	if counts.Total() != n {
		t.Errorf("Counts.Total() = %d, want %d", counts.Total(), n)
	}
	if counts.Succeeded != len(answered) || counts.Dead != len(dead) || counts.NotRun != len(notRun) {
		t.Errorf("Counts = %+v, but OnResult saw %d, the Sink %d and OnNotRun %d", counts, len(answered), len(dead), len(notRun))
	}
	seen := make(map[string][]string, n)
	for _, id := range answered {
		seen[id] = append(seen[id], "answered")
	}
	for _, d := range dead {
		seen[d.ID] = append(seen[d.ID], "dead")
	}
	for _, id := range notRun {
		seen[id] = append(seen[id], "not run")
	}
	lost := 0
	for _, req := range reqs {
		if ends := seen[req.ID]; len(ends) != 1 {
			if lost++; lost <= 10 {
				t.Errorf("item %s ended %d times %v, want once", req.ID, len(ends), ends)
			}
		}
		delete(seen, req.ID)
	}
	if lost > 0 || len(seen) > 0 {
		t.Errorf("%d items did not end exactly once; %d ids ended that no item had", lost, len(seen))
	}
}

// checkRequests checks that the servers saw exactly the requests that the
// chain recorded, request for request (check 2), and counts the attempts
// by kind. A Call makes one request per attempt, marked with the
// attempt's key; a request whose bytes never all reached the socket (its
// deadline passed while it dialled or wrote) cannot have been logged, and
// every other must have been. It returns the times of the answered
// attempts.
func (f *soakFigures) checkRequests(t *testing.T, attempts []soakAttempt, calls []soakCall, logs [][]llmretrytest.Request) []time.Duration {
	t.Helper()
	recorded := map[string]int{}
	var answers []time.Duration
	for _, r := range attempts {
		if r.skipped {
			f.skips++
			continue
		}
		f.attempts++
		recorded[r.key]++
		f.kinds[r.kind]++
		if r.delivered {
			f.delivered++
		}
		if r.kind == "ok" {
			answers = append(answers, r.elapsed)
		}
	}
	called, wrote := map[string]int{}, map[string]int{}
	for _, c := range calls {
		called[c.key]++
		switch {
		case c.sent:
			wrote[c.key]++
		case c.wrote:
			f.wroteUnsent++
			f.unsent++
		default:
			f.unsent++
		}
	}
	logged, misplaced := map[string]int{}, 0
	for i, log := range logs {
		for _, req := range log {
			key := req.Header.Get("X-Soak-Attempt")
			if b := backendOf(key); b != i && misplaced < 10 {
				misplaced++
				t.Errorf("server %d logged request %q (model %q, step %q), want one marked for backend %d", i, key, req.Model, req.Step, i)
			}
			logged[key]++
		}
	}
	diffCounts(t, "attempts recorded (non-skipped)", recorded, "requests the Calls made", called)
	diffCounts(t, "requests whose bytes reached a socket", wrote, "requests the servers logged", logged)
	return answers
}

// run is the outer chain's Call: one run of one item. It gives the run
// its deadline and its cancellation, drawn from the seed by item and run,
// and its state, then runs the inner chain.
func (s *soaker) run(ctx context.Context, req soakReq) (string, error) {
	run := int(s.runs[req.Index].Add(1))
	rng := rand.New(rand.NewPCG(s.seed, uint64(req.Index)<<8|uint64(run)))
	var timeout time.Duration
	switch {
	case req.Doomed:
		timeout = time.Duration(1+rng.IntN(3)) * time.Millisecond
	case rng.IntN(100) < 30:
		timeout = time.Duration(10+rng.IntN(240)) * soakScale * time.Millisecond
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var withdrawn atomic.Bool
	if rng.IntN(100) < 4 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		timer := time.AfterFunc(time.Duration(rng.IntN(40))*time.Millisecond, func() {
			withdrawn.Store(true)
			cancel(errWithdrawn)
		})
		defer timer.Stop()
	}
	rs := &runState{key: fmt.Sprintf("%s/%d", req.ID, run), prevEnd: time.Now()}
	resp, err := s.inner.Do(context.WithValue(ctx, runKey{}, rs), req)

	s.checkRun(rs, err)
	var cancelled *llmretry.Cancelled
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runStates = append(s.runStates, rs)
	if timeout > 0 {
		s.deadlines++
	}
	if withdrawn.Load() && errors.As(err, &cancelled) {
		s.cancels++
	}
	return resp, err
}

// onAttempt keeps every record with its request's key, and measures the
// chain's own time before it.
//
// The chain's overhead is the time Do spends outside Call and outside the
// waits it chose. Per record it is the gap between the moment the chain
// was free to go on and the record's Start: for the first, Do's start
// (taken just before Do is called); for a later one, the end of the one
// before (Start + Elapsed), plus its RetryIn when it was retried. The gap
// covers the chain's bookkeeping, the breaker's admission, OnAttempt
// itself (this function: a key and three appends), and the scheduler:
// the lateness of a retry's timer, and any time the goroutine waited for
// a CPU, which on a loaded machine is most of a long gap. Gaps are kept
// in three classes: those with none of the timer in them, those after a
// retry's wait, and those on the plan's last backend, where the call may
// also have waited for that backend's breaker to half-open, a wait that
// no record shows.
func (s *soaker) onAttempt(ctx context.Context, a llmretry.Attempt) {
	rs, ok := ctx.Value(runKey{}).(*runState)
	if !ok {
		s.problem("OnAttempt: context without the run's state, attempt %v", a)
		return
	}
	if rs.has && a.Backend < rs.last.Backend {
		rs.wrapped = true // the plan came back to a backend it skipped
	}
	waitPossible := a.Backend == len(soakModels)-1 || rs.wrapped
	afterRetry := rs.has && rs.last.Next == llmretry.NextRetry
	gap := a.Start.Sub(rs.prevEnd)
	rs.prevEnd = a.Start.Add(a.Elapsed)
	if a.Next == llmretry.NextRetry {
		rs.prevEnd = rs.prevEnd.Add(a.RetryIn)
	}
	rs.last, rs.has = a, true
	if !a.Skipped {
		if rs.sent == nil {
			rs.sent = make([]int, len(soakModels))
		}
		rs.sent[a.Backend]++
	}
	key := fmt.Sprintf("%s/%d/%d", rs.key, a.Backend, a.Try)

	rs.records = append(rs.records, a)
	rs.keys = append(rs.keys, key)
	class := gapBookkeeping
	switch {
	case waitPossible:
		class = gapBreaker
	case afterRetry:
		class = gapTimer
	}
	rs.gaps[class] = append(rs.gaps[class], gap)
}

// call returns backend bi's Call: a plain net/http client of api at url.
// It marks each request with its attempt's key, and records whether the
// request's bytes all reached the socket.
func (s *soaker) call(bi int, api, model, url string) func(context.Context, soakReq) (string, error) {
	return func(ctx context.Context, req soakReq) (string, error) {
		rs, ok := ctx.Value(runKey{}).(*runState)
		if !ok {
			s.problem("Call: context without the run's state")
			return "", errors.New("soak: no run state")
		}
		// The chain does not tell a Call its try; the records so far do:
		// a backend's tries count its requests in the run, a come-back
		// after a skip or a put-off retry included (Attempt.Try).
		try := 1
		if rs.sent != nil {
			try = rs.sent[bi] + 1
		}
		key := fmt.Sprintf("%s/%d/%d", rs.key, bi, try)

		body := requestBody(api, model, req)
		var conn atomic.Pointer[soakConn]
		var wrote atomic.Bool
		trace := &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				c, ok := info.Conn.(*soakConn)
				if !ok {
					s.problem("Call: connection of type %T, want *soakConn", info.Conn)
					return
				}
				conn.Store(c)
			},
			// WroteRequest is called once the request is in the
			// transport's buffer, before it is flushed to the socket: a
			// cancel in between leaves it unsent. It is kept only to count
			// those; the connection's own record decides.
			WroteRequest: func(info httptrace.WroteRequestInfo) {
				if info.Err == nil {
					wrote.Store(true)
				}
			},
		}
		hreq, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("X-Soak-Attempt", key)
		resp, err := s.client.Do(hreq)
		var text string
		if err == nil {
			text, err = readAnswer(ctx, url, resp)
			resp.Body.Close()
		}
		sent := false
		if c := conn.Load(); c != nil {
			sent = c.settle(body)
		}
		rs.calls = append(rs.calls, soakCall{key: key, backend: bi, sent: sent, wrote: wrote.Load()})
		return text, err
	}
}

// soakConn is a client connection that keeps every byte the socket
// accepted, so that a Call knows for certain whether its request went
// out whole: a server logs a request once it has read the whole body.
type soakConn struct {
	net.Conn
	mu  sync.Mutex // held through each Write, so that settle sees it finished
	out []byte
}

func (c *soakConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.out = append(c.out, p[:n]...)
	return n, err
}

// settle closes the connection, which ends a Write under way and fails
// any later one, and reports whether the request with body went out
// whole: its header's end and then the whole body. Its Call is done with
// it (a second Close, by the transport, does nothing).
func (c *soakConn) settle(body []byte) bool {
	_ = c.Conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	head, rest, ok := bytes.Cut(c.out, []byte("\r\n\r\n"))
	return ok && len(head) > 0 && bytes.Equal(rest, body)
}

// requestBody is a minimal request body of api for model.
func requestBody(api, model string, req soakReq) []byte {
	prompt := "Say something about " + req.ID + "."
	if api == "anthropic" {
		return fmt.Appendf(nil, `{"model":%q,"max_tokens":64,"stream":%t,"messages":[{"role":"user","content":%q}]}`, model, req.Stream, prompt)
	}
	return fmt.Appendf(nil, `{"model":%q,"stream":%t,"messages":[{"role":"user","content":%q}]}`, model, req.Stream, prompt)
}

// readAnswer reads a response as a careful client would, and says how it
// failed with the package's Failures. Its errors name the whole URL, as
// net/http's do: the records must hide its secrets.
func readAnswer(ctx context.Context, url string, resp *http.Response) (string, error) {
	if resp.StatusCode >= 400 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if err != nil {
			return "", fmt.Errorf("POST %s: reading the error response: %w", url, err)
		}
		return "", llmretry.StatusFailure(resp.StatusCode, resp.Header, fmt.Errorf("POST %s: %s", url, errorMessage(b)))
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return readStream(ctx, url, resp.Body)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("POST %s: reading the answer: %w", url, err)
	}
	var m struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		StopReason *string `json:"stop_reason"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", llmretry.ParseFailure(string(b), fmt.Errorf("POST %s: decoding the answer: %w", url, err))
	}
	var text strings.Builder
	finish := m.StopReason
	for _, c := range m.Choices {
		text.WriteString(c.Message.Content)
		finish = c.FinishReason
	}
	for _, c := range m.Content {
		text.WriteString(c.Text)
	}
	return finished(url, text.String(), finish)
}

// readStream reads an OpenAI or Anthropic stream, telling the chain of
// every chunk of text it hands over.
func readStream(ctx context.Context, url string, body io.Reader) (string, error) {
	var text strings.Builder
	var finish *string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // "event:" lines and the blank lines between events
		}
		if data == "[DONE]" {
			return finished(url, text.String(), finish)
		}
		var ev struct {
			Type  string `json:"type"`
			Error *struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Delta *struct {
				Text       string  `json:"text"`
				StopReason *string `json:"stop_reason"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return "", llmretry.ParseFailure(data, fmt.Errorf("POST %s: decoding a stream event: %w", url, err))
		}
		if ev.Error != nil {
			kind := llmretry.KindRejected
			switch ev.Error.Type {
			case "overloaded_error", "api_error", "server_error", "rate_limit_error":
				kind = llmretry.KindTransient
			}
			return "", &llmretry.Failure{Kind: kind, Err: fmt.Errorf("POST %s: stream error %s: %s", url, ev.Error.Type, ev.Error.Message)}
		}
		if ev.Type == "message_stop" {
			return finished(url, text.String(), finish)
		}
		chunk := ""
		for _, c := range ev.Choices {
			chunk += c.Delta.Content
			if c.FinishReason != nil {
				finish = c.FinishReason
			}
		}
		if ev.Delta != nil {
			chunk += ev.Delta.Text
			if ev.Delta.StopReason != nil {
				finish = ev.Delta.StopReason
			}
		}
		if chunk != "" {
			text.WriteString(chunk)
			llmretry.Delivered(ctx)
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("POST %s: reading the stream: %w", url, err)
	}
	return "", llmretry.ParseFailure(text.String(), fmt.Errorf("POST %s: the stream ended unfinished", url))
}

// finished is the outcome of an answer with text that ended for reason
// finish.
func finished(url, text string, finish *string) (string, error) {
	switch {
	case finish == nil:
		return "", llmretry.ParseFailure(text, fmt.Errorf("POST %s: the answer has no finish reason", url))
	case *finish == "length" || *finish == "max_tokens":
		return "", llmretry.Truncation(text)
	}
	return text, nil
}

// errorMessage is the message of a provider's error body, or the body.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
		return string(b)
	}
	return e.Error.Type + ": " + e.Error.Message
}

// script is a model's steps: mostly answers, with faults of every kind
// scattered among them, and outages, runs of failures long enough to
// open its breaker. Delays are milliseconds, so that the batch is quick.
func script(rng *rand.Rand, steps, items int) []llmretrytest.Step {
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	retryAfter := func(lo, hi int) string { return fmt.Sprint(lo + rng.IntN(hi-lo+1)) }
	answer := func() llmretrytest.Step {
		return llmretrytest.Answer(fmt.Sprintf("Answer %d is short and to the point.", rng.IntN(items)))
	}
	outage := func() llmretrytest.Step {
		switch p := rng.IntN(100); {
		case p < 40:
			return llmretrytest.Status(503).After(ms(0, 2))
		case p < 60:
			return llmretrytest.Status(529)
		case p < 75:
			return llmretrytest.Hangup()
		case p < 90:
			return llmretrytest.Status(429).WithHeader("retry-after-ms", retryAfter(5, 30))
		case p < 95:
			return llmretrytest.StallHeaders()
		}
		return llmretrytest.StreamDrop(0)
	}
	healthy := func() llmretrytest.Step {
		switch p := rng.IntN(100); {
		case p < 62:
			return answer().After(ms(0, 3))
		case p < 64:
			return answer().Every(ms(1, 3)) // a stream that takes its time
		case p < 67:
			return llmretrytest.Status(429).WithHeader("retry-after-ms", retryAfter(1, 40))
		case p < 68:
			return llmretrytest.Status(429).WithHeader("retry-after-ms", "500") // past every MaxWait
		case p < 70:
			return llmretrytest.Status(500)
		case p < 72:
			return llmretrytest.Status(503)
		case p < 73:
			return llmretrytest.Status(529)
		case p < 75:
			return llmretrytest.Truncated("Answer cut off at the")
		case p < 77:
			return llmretrytest.ContextLengthExceeded()
		case p < 78:
			return llmretrytest.Status(400)
		case p < 80:
			return llmretrytest.Hangup().After(ms(0, 2))
		case p < 82:
			return llmretrytest.StreamDrop(rng.IntN(4))
		case p < 83:
			return llmretrytest.StreamStall(rng.IntN(3))
		case p < 84:
			return llmretrytest.StallHeaders()
		case p < 86:
			return llmretrytest.Malformed()
		case p < 88:
			return llmretrytest.StreamError("overloaded_error")
		case p < 89:
			return llmretrytest.StreamUnfinished(2)
		case p < 99:
			return answer().After(ms(10, 40))
		}
		return answer().After(ms(400, 500) * soakScale) // past the backend's Timeout
	}
	out := make([]llmretrytest.Step, 0, steps+100)
	for len(out) < steps {
		if rng.IntN(1000) < 4 {
			for range 10 + rng.IntN(50) {
				out = append(out, outage())
			}
			continue
		}
		out = append(out, healthy())
	}
	return append(out, llmretrytest.Answer("The script ran out; this answer repeats."))
}

// backendOf is the backend in an attempt's key, or -1.
func backendOf(key string) int {
	parts := strings.Split(key, "/")
	if len(parts) != 4 {
		return -1
	}
	var b int
	if _, err := fmt.Sscan(parts[2], &b); err != nil {
		return -1
	}
	return b
}

// diffCounts reports where two multisets of keys differ, the first few
// differences in full.
func diffCounts(t *testing.T, wantName string, want map[string]int, gotName string, got map[string]int) {
	t.Helper()
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			diffs = append(diffs, fmt.Sprintf("%s: %d in %s, %d in %s", k, want[k], wantName, got[k], gotName))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: 0 in %s, %d in %s", k, wantName, got[k], gotName))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("%d keys differ between %s and %s; the first:\n%s", len(diffs), wantName, gotName, strings.Join(diffs[:min(len(diffs), 10)], "\n"))
	}
}

func hasAny(s string, secrets []string) bool {
	return slices.ContainsFunc(secrets, func(secret string) bool { return strings.Contains(s, secret) })
}

// Classes of the gaps before records (see onAttempt).
const (
	gapBookkeeping = iota // the chain's own work alone
	gapTimer              // after a retry's wait: its timer's lateness too
	gapBreaker            // on the plan's last backend, where the call may have waited for its breaker
	gapClasses
)

// gapFigures are the median and 99th percentile of n gaps.
type gapFigures struct {
	n        int
	p50, p99 time.Duration
}

func gapFiguresOf(ds []time.Duration) gapFigures {
	return gapFigures{n: len(ds), p50: percentile(ds, 50), p99: percentile(ds, 99)}
}

// percentile returns the pth percentile of ds (sorting it), or 0 for
// none.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)*p/100, len(ds)-1)]
}

// settledHeap is the live heap after two collections: sync.Pools keep
// their items through one.
func settledHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// settledGoroutines returns the number of goroutines once it is at most
// want, or after a bound far above the time that goroutines on their way
// out (a connection's read loop after its Close) need.
func settledGoroutines(want int) int {
	n := runtime.NumGoroutine()
	waitUntil(5*time.Second, func() bool {
		n = runtime.NumGoroutine()
		return n <= want
	})
	return n
}

// waitUntil polls ok until it holds or d has passed.
func waitUntil(d time.Duration, ok func() bool) {
	deadline := time.Now().Add(d)
	for !ok() && time.Now().Before(deadline) {
		runtime.Gosched() // real sockets, so no synctest: poll, within a bound no healthy run comes near
	}
}

// allStacks returns every goroutine's stack.
func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}
