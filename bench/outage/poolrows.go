package outage

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The rows of the pool scenarios: llmretry's pool; llmretry's ordered
// chain of the same deployments; and four gateways' ways of balancing,
// modelled from their documentation as plain Go. Each is played by
// fleets of PoolSizes processes, caller i going to process i mod N.

// PoolSizes are the fleets the pool tables show.
var PoolSizes = []int{1, 4, 16}

// The pool rows' names.
const (
	namePool       = "llmretry pool"
	nameOrdered    = "llmretry ordered chain"
	nameRandom     = "random (LiteLLM simple-shuffle)"
	nameRoundRobin = "round-robin"
	nameLeastBusy  = "least-busy (LiteLLM least-busy)"
	nameUsageBased = "usage-based, own counts (LiteLLM usage-based-routing)"
)

// PoolStrategies are the rows of a fleet of n processes. The llmretry
// rows' Breakers, one per deployment in each process, share one
// llmretrytest.MemoryStore (2 ms a call), each deployment under its own
// key; the gateways keep their state in each process, as a gateway
// without a shared cache does.
func PoolStrategies(n int) []Strategy {
	return []Strategy{
		{Name: namePool, Breaker: true, Paced: true, build: llmretryFleet(n, true)},
		{Name: nameOrdered, Breaker: true, Paced: true, build: llmretryFleet(n, false)},
		{Name: nameRandom, Peer: true, build: gatewayFleet(n, pickRandom)},
		{Name: nameRoundRobin, Peer: true, build: gatewayFleet(n, pickRoundRobin)},
		{Name: nameLeastBusy, Peer: true, build: gatewayFleet(n, pickLeastBusy)},
		{Name: nameUsageBased, Peer: true, build: gatewayFleet(n, pickLeastUsed)},
	}
}

// estimate is what request id will use, as an adapter estimates it
// before sending: its input tokens, and its completion budget.
func (e *Env) estimate(id int) llmretry.Usage {
	return llmretry.Usage{InputTokens: int64(e.calls[id].in), OutputTokens: int64(e.sc.Tokens.MaxTokens)}
}

// usage reads the usage block of a 200's chat completion.
func usage(resp *http.Response) (llmretry.Usage, error) {
	defer resp.Body.Close()
	var c struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return llmretry.Usage{}, err
	}
	return llmretry.Usage{InputTokens: c.Usage.Prompt, OutputTokens: c.Usage.Completion}, nil
}

// deploymentCall is the Call of deployment d as an adapter writes it:
// every response's rate-limit headers go to ReportLimits, an answer's
// usage to ReportUsage, and any other status is a StatusFailure. It
// answers with d, the deployment that answered.
func (e *Env) deploymentCall(d int) func(ctx context.Context, id int) (int, error) {
	c := e.client(d, 0)
	return func(ctx context.Context, id int) (int, error) {
		resp, err := e.send(ctx, c, d, id)
		if err != nil {
			return -1, err
		}
		llmretry.ReportLimits(ctx, resp.Header)
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return -1, llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
		}
		u, err := usage(resp)
		if err != nil {
			return -1, err
		}
		llmretry.ReportUsage(ctx, u)
		return d, nil
	}
}

// llmretryFleet builds n processes of llmretry, each with the scenario's
// deployments as a Pool (pooled) or as an ordered chain, their Breakers
// sharing one store, each request estimated by Env.estimate.
func llmretryFleet(n int, pooled bool) func(e *Env) doFunc {
	return llmretryFleetOf(n, pooled, (*Env).estimate)
}

// llmretryFleetOf is llmretryFleet with each request estimated by est.
func llmretryFleetOf(n int, pooled bool, est func(e *Env, id int) llmretry.Usage) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		store := &llmretrytest.MemoryStore{Latency: storeLatency}
		e.storeCalls = func() int64 {
			c := store.Calls()
			return c.Loads + c.Swaps + c.Watches
		}
		procs := make([]doFunc, n)
		for i := range procs {
			procs[i] = llmretryOf(e, store, pooled, func(id int) llmretry.Usage { return est(e, id) })
		}
		return func(ctx context.Context, id int) (int, error) { return procs[id%n](ctx, id) }
	}
}

// llmretryOf is one process's chain. Each deployment is a Backend as an
// adapter builds it (deploymentCall, a 30 s Timeout, est) with a
// zero Breaker, which paces by the rate-limit reports, keeping its state
// in store under the deployment's name. The pool has the chain rows'
// waits of 1, 2, 4 and 8 s and a Reserve of 3 s, the slowest answer; the
// ordered chain puts the deployments in order of tier, each with those
// waits, a Reserve of half the deadline but for the last, whose is 3 s.
func llmretryOf(e *Env, store llmretry.BreakerStore, pooled bool, est func(id int) llmretry.Usage) doFunc {
	waits := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	provs := e.sc.providers()
	backends := make([]llmretry.Backend[int, int], len(provs))
	for i, p := range provs {
		backends[i] = llmretry.Backend[int, int]{
			Model: p.Name, Call: e.deploymentCall(i), Timeout: attemptTimeout,
			Breaker:  &llmretry.Breaker{Store: store, Key: p.Name},
			Estimate: est,
		}
	}
	if pooled {
		pool := make([]llmretry.Deployment[int, int], len(provs))
		for i, p := range provs {
			pool[i] = llmretry.Deployment[int, int]{Name: p.Name, Backend: backends[i], Tier: p.Tier}
		}
		chain := &llmretry.Chain[int, int]{Backends: []llmretry.Backend[int, int]{
			{Model: "pool", Pool: pool, Retry: llmretry.Policy{Waits: waits, Reserve: secondaryAnswer}},
		}}
		return chain.Do
	}
	order := make([]int, len(provs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return provs[a].Tier - provs[b].Tier })
	chain := &llmretry.Chain[int, int]{}
	for k, i := range order {
		b := backends[i]
		b.Retry = llmretry.Policy{Waits: waits, Reserve: poolDeadline / 2}
		if k == len(order)-1 {
			b.Retry.Reserve = secondaryAnswer
		}
		chain.Backends = append(chain.Backends, b)
	}
	return chain.Do
}

// The gateways' retries and cooldowns, as LiteLLM's Router documents
// them, for every gateway row: two retries after the first try
// (num_retries); a deployment that answers 429 is cooled down (left out
// of the choice) for 5 s at once, and one that fails otherwise once it
// has failed more than 3 times in the minute (allowed_fails); a retry
// goes at once while more than one deployment is not cooled down, and
// otherwise after the 429's Retry-After (up to 60 s) or a backoff of
// 0.5 s doubling up to 8 s. A try that finds every deployment cooled
// down (or, usage-based, at its configured limits) sends nothing and
// counts as a failed try. Deployments of a later order (a pool's tier)
// are chosen only when none of an earlier one is left to choose.
const (
	gatewayRetries      = 2
	gatewayCooldown     = 5 * time.Second
	gatewayAllowedFails = 3
	gatewayFirstWait    = 500 * time.Millisecond
	gatewayMaxWait      = 8 * time.Second
	gatewayMaxHint      = 60 * time.Second
)

// gateway is one process's router for one gateway strategy: what it
// counts of each deployment, as that process saw it.
type gateway struct {
	e       *Env
	pick    picker
	clients []*http.Client

	mu       sync.Mutex
	cooled   []time.Time // cooled down until
	fails    []perMinute // failures, for allowed_fails
	inFlight []int
	used     []perMinute // answers and their tokens, for usage-based routing
	turn     int         // round-robin's next
}

// perMinute counts within one minute of the clock, as LiteLLM keys its
// counts by the current minute; another minute starts from zero.
type perMinute struct {
	minute           int64
	requests, tokens int
}

// at is the count as it stands in the minute of now.
func (c perMinute) at(now time.Time) perMinute {
	if m := now.Unix() / 60; m != c.minute {
		return perMinute{minute: m}
	}
	return c
}

// picker chooses, among the candidates (deployments not cooled down, of
// the earliest order; at least one), the one request id goes to on its
// try; -1 when none can take it. It runs under g.mu.
type picker func(g *gateway, cands []int, id, try int, now time.Time) int

// pickRandom is LiteLLM's simple-shuffle without weights: a uniform
// draw, seeded by the request and its try.
func pickRandom(g *gateway, cands []int, id, try int, _ time.Time) int {
	r := rand.New(rand.NewPCG(g.e.seed^0x73687566666c65, uint64(id)<<4|uint64(try)))
	return cands[r.IntN(len(cands))]
}

// pickRoundRobin takes the candidates in turn.
func pickRoundRobin(g *gateway, cands []int, _, _ int, _ time.Time) int {
	d := cands[g.turn%len(cands)]
	g.turn++
	return d
}

// pickLeastBusy is LiteLLM's least-busy: the fewest requests in flight
// from this process, the first in order on a tie.
func pickLeastBusy(g *gateway, cands []int, _, _ int, _ time.Time) int {
	best := cands[0]
	for _, d := range cands[1:] {
		if g.inFlight[d] < g.inFlight[best] {
			best = d
		}
	}
	return best
}

// pickLeastUsed is LiteLLM's usage-based-routing: each deployment is
// configured with its limits per minute (rpm and tpm, here its buckets'
// rates times 60); a deployment whose tokens answered this minute, by
// this process's own count, plus the request's input would pass its tpm,
// or whose answers would pass its rpm, is left out, and of the rest the
// one with the fewest tokens used this minute is chosen, the first in
// order on a tie.
func pickLeastUsed(g *gateway, cands []int, id, _ int, now time.Time) int {
	provs := g.e.sc.providers()
	best, bestTokens := -1, 0
	for _, d := range cands {
		u := g.used[d].at(now)
		p := provs[d]
		if p.TokenRate > 0 && float64(u.tokens+g.e.calls[id].in) > p.TokenRate*60 {
			continue
		}
		if p.Rate > 0 && float64(u.requests+1) > p.Rate*60 {
			continue
		}
		if best < 0 || u.tokens < bestTokens {
			best, bestTokens = d, u.tokens
		}
	}
	return best
}

// gatewayFleet builds n processes, each with its own gateway of pick.
func gatewayFleet(n int, pick picker) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		procs := make([]doFunc, n)
		for i := range procs {
			procs[i] = newGateway(e, pick).do
		}
		return func(ctx context.Context, id int) (int, error) { return procs[id%n](ctx, id) }
	}
}

func newGateway(e *Env, pick picker) *gateway {
	n := len(e.transports)
	g := &gateway{e: e, pick: pick, cooled: make([]time.Time, n), fails: make([]perMinute, n),
		inFlight: make([]int, n), used: make([]perMinute, n)}
	for d := range n {
		g.clients = append(g.clients, e.client(d, attemptTimeout))
	}
	return g
}

// errNoDeployment is a try that found no deployment to send to.
var errNoDeployment = errors.New("outage: no deployments available")

// do sends request id as the gateway does.
func (g *gateway) do(ctx context.Context, id int) (int, error) {
	var err error
	for try := 0; ; try++ {
		var hint time.Duration
		var d int
		d, hint, err = g.try(ctx, id, try)
		if err == nil {
			return d, nil
		}
		if ctx.Err() != nil || try == gatewayRetries {
			return -1, err
		}
		wait := g.wait(try, hint)
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return -1, err
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return -1, ctx.Err()
			}
		}
	}
}

// try makes one try: it picks a deployment, sends, and counts the
// outcome; hint is a 429's Retry-After.
func (g *gateway) try(ctx context.Context, id, try int) (d int, hint time.Duration, err error) {
	now := time.Now()
	g.mu.Lock()
	d = -1
	if cands := g.candidates(now); len(cands) > 0 {
		d = g.pick(g, cands, id, try, now)
	}
	if d < 0 {
		g.mu.Unlock()
		return -1, 0, errNoDeployment
	}
	g.inFlight[d]++
	g.mu.Unlock()

	resp, err := g.e.send(ctx, g.clients[d], d, id)
	var u llmretry.Usage
	status := 0
	if err == nil {
		status = resp.StatusCode
		if status == http.StatusOK {
			u, err = usage(resp)
		} else {
			resp.Body.Close()
			if s, perr := time.ParseDuration(resp.Header.Get("Retry-After") + "s"); perr == nil {
				hint = s
			}
			err = &statusError{status}
		}
	}

	now = time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight[d]--
	switch {
	case err == nil:
		c := g.used[d].at(now)
		c.requests++
		c.tokens += int(u.InputTokens + u.OutputTokens)
		g.used[d] = c
		return d, 0, nil
	case ctx.Err() != nil:
		// The caller's deadline says nothing of the deployment.
	case status == http.StatusTooManyRequests:
		g.cooled[d] = now.Add(gatewayCooldown)
	default:
		f := g.fails[d].at(now)
		f.requests++
		g.fails[d] = f
		if f.requests > gatewayAllowedFails {
			g.cooled[d] = now.Add(gatewayCooldown)
		}
	}
	return -1, hint, err
}

// candidates are the deployments not cooled down at now, of the earliest
// order (tier) that has one.
func (g *gateway) candidates(now time.Time) []int {
	provs := g.e.sc.providers()
	var out []int
	for d, p := range provs {
		if now.Before(g.cooled[d]) {
			continue
		}
		if len(out) > 0 && p.Tier > provs[out[0]].Tier {
			continue
		}
		if len(out) > 0 && p.Tier < provs[out[0]].Tier {
			out = out[:0]
		}
		out = append(out, d)
	}
	return out
}

// wait is the time before retry try+1: none while more than one
// deployment is not cooled down, else the hint (up to a minute) or the
// backoff.
func (g *gateway) wait(try int, hint time.Duration) time.Duration {
	now := time.Now()
	g.mu.Lock()
	healthy := 0
	for d := range g.cooled {
		if !now.Before(g.cooled[d]) {
			healthy++
		}
	}
	g.mu.Unlock()
	if healthy > 1 {
		return 0
	}
	if hint > 0 && hint <= gatewayMaxHint {
		return hint
	}
	return min(gatewayFirstWait<<try, gatewayMaxWait)
}
