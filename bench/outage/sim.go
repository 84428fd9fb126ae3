package outage

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing/synctest"
	"time"
)

// How long a provider takes to fail, as providers commonly do.
const (
	fail503 = 500 * time.Millisecond
	fail429 = 200 * time.Millisecond
)

// idHeader carries the request's number from the strategy to the
// provider: the request's identity decides its truncation, and the caller's
// identity keeps the retry-after each caller was given.
const idHeader = "X-Outage-Request"

// Phase is one stretch of a provider's script. A request sent before
// Until (measured from the start of the run) gets the phase's answer;
// after the last phase the provider is healthy.
type Phase struct {
	Until      time.Duration
	Status     int           // 503 or 429; 0 for a hang; 200 for healthy (the buckets decide), as after the last phase
	RetryAfter time.Duration // the Retry-After header, in whole seconds; 0: none
	Hang       time.Duration // with Status 0: the request answers 200 after this long
}

// Provider is the script of one backend.
type Provider struct {
	Name     string
	Answer   time.Duration // how long a healthy answer takes
	Phases   []Phase
	Rate     float64 // token bucket: tokens per second; 0 means no rate limit
	Burst    int     // token bucket: its size, full at the start
	Truncate float64 // the share of requests this provider cuts off at the budget

	// A second bucket, of the model's tokens, beside the requests' (pool
	// scenarios): a request costs its input and output tokens (see
	// [Tokens]) and is let through only when both buckets hold what it
	// costs. 0 means no such limit.
	TokenRate  float64 // the model's tokens added per second
	TokenBurst int     // the most the bucket holds, full at the start

	// Tier is the deployment's priority in a pool scenario: 0 is the
	// first, higher tiers take what the lower ones cannot.
	Tier int
}

// Scenario is one scripted outage.
type Scenario struct {
	Name     string
	About    string        // one line for the report
	Requests int           // how many callers
	Over     time.Duration // arrivals are uniform at seeded random times in [0, Over)
	Deadline time.Duration // each caller's deadline from its arrival; 0 means none
	Primary  Provider
	Second   Provider

	// Pool scenarios: the deployments of one model, in the pool's order;
	// when set, Primary and Second are not used.
	Deployments []Provider
	// Tokens is what each request costs, for the providers' tokens
	// buckets and the usage their answers report; the zero Tokens is
	// the fixed 10 in and 10 out of the scenarios without such buckets.
	Tokens Tokens
	// Waves, when set, replace Requests and Over: arrivals come in
	// stretches, each at its own rate.
	Waves []Wave
}

// Tokens is the cost of the requests of a scenario: each request's input
// and output tokens are drawn uniformly, seeded by its number, from In
// and Out; MaxTokens is the completion budget every request asks for,
// which its output never exceeds.
type Tokens struct {
	In, Out   [2]int
	MaxTokens int
}

// Wave is one stretch of arrivals: Requests at seeded uniform times from
// the end of the previous wave until Until.
type Wave struct {
	Until    time.Duration
	Requests int
}

// providers are the scenario's backends, in order.
func (sc *Scenario) providers() []*Provider {
	if len(sc.Deployments) > 0 {
		ps := make([]*Provider, len(sc.Deployments))
		for i := range sc.Deployments {
			ps[i] = &sc.Deployments[i]
		}
		return ps
	}
	return []*Provider{&sc.Primary, &sc.Second}
}

// requests is how many callers the scenario has.
func (sc *Scenario) requests() int {
	if len(sc.Waves) == 0 {
		return sc.Requests
	}
	n := 0
	for _, w := range sc.Waves {
		n += w.Requests
	}
	return n
}

// span is when the last arrival may come.
func (sc *Scenario) span() time.Duration {
	if len(sc.Waves) == 0 {
		return sc.Over
	}
	return sc.Waves[len(sc.Waves)-1].Until
}

// cost draws request id's input and output tokens.
func (t Tokens) cost(seed uint64, id int) (in, out int) {
	if t == (Tokens{}) {
		return 10, 10
	}
	r := rand.New(rand.NewPCG(seed^0x746f6b656e73, uint64(id)))
	draw := func(b [2]int) int { return b[0] + r.IntN(b[1]-b[0]+1) }
	return draw(t.In), draw(t.Out)
}

// caller is one request's life, as the providers saw it. The dispatcher
// writes the fields during the run; the report reads them after.
type caller struct {
	id       int
	arrive   time.Duration // from the start of the run
	deadline time.Duration // absolute, from the start; 0 means none

	raUntil []time.Duration // when the last retry-after each provider gave this caller runs out
	early   int             // requests sent before that
	flights []flight        // every request sent, in order
	in, out int             // the tokens the request costs: its input, and the output it generates

	done       time.Duration // when the strategy returned
	answered   bool
	by         int // which provider answered
	answeredAt time.Duration
}

// flight is one request: sent at send, ended (answered or cut) at end.
type flight struct{ send, end time.Duration }

// world is one run of one scenario with one strategy: the providers, the
// callers, the dispatcher and the counters.
type world struct {
	seed  uint64
	t0    time.Time
	provs []*provider
	calls []*caller

	// The dispatcher's queue. Goroutines append and wait; the dispatcher
	// runs the queue at each instant once everyone else is blocked.
	mu    sync.Mutex
	queue []*event
	wake  chan struct{}
	order *rand.Rand // nil: caller order; else a seeded shuffle of it

	// Counters, written only by the dispatcher.
	sent     []int // by provider
	got429   int
	billed   int
	sentBins []int // requests sent per bin
	ansBins  []int // answers per bin
	bins429  []int // requests answered 429, per bin of their send

	// The same by provider, for the pictures of pools: requests sent
	// and answered 429 per bin, and the 429s.
	sentBinsBy, bins429By [][]int
	got429By              []int
}

// bin is the width of the time series that the SVGs draw.
const bin = 10 * time.Second

// event is one thing a provider must decide in caller order.
type event struct {
	c    *caller
	prov int
	fn   func()
	done chan struct{}
}

// now is the time since the start of the run on the bubble's clock.
func (w *world) now() time.Duration { return time.Since(w.t0) }

// do runs fn on the dispatcher, at this instant, after every goroutine the
// instant woke has run, in caller order; it returns when fn has run.
func (w *world) do(c *caller, prov int, fn func()) {
	ev := &event{c: c, prov: prov, fn: fn, done: make(chan struct{})}
	w.mu.Lock()
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default: // the dispatcher is already woken
	}
	<-ev.done
}

// dispatch is the dispatcher: it waits until every other goroutine of the
// bubble is blocked, so that everything due at this instant (answers,
// deadlines, retries) has happened, then runs the queue in caller order.
func (w *world) dispatch(stop <-chan struct{}) {
	for {
		select {
		case <-w.wake:
		case <-stop:
			return
		}
		synctest.Wait()
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		w.mu.Unlock()
		// One caller has one goroutine, so it has at most one event in an
		// instant's queue; the stable sort keeps any tie as queued.
		slices.SortStableFunc(q, func(a, b *event) int {
			if a.c.id != b.c.id {
				return a.c.id - b.c.id
			}
			return a.prov - b.prov
		})
		if w.order != nil {
			// Outside the bubble, goroutine scheduling decides who of
			// those due at one instant reaches a provider first; a replay
			// in another order checks that the outcomes do not hang on it.
			w.order.Shuffle(len(q), func(i, j int) { q[i], q[j] = q[j], q[i] })
		}
		for _, ev := range q {
			ev.fn()
			close(ev.done)
			// Let this caller run until it blocks again before the next
			// one goes, so that what it does next (tell a breaker how its
			// request went, pick its next wait) happens in caller order
			// too, not in whatever order the scheduler runs them.
			synctest.Wait()
		}
	}
}

// provider is a scripted backend: an http.RoundTripper.
type provider struct {
	*Provider
	w      *world
	index  int
	tokens float64       // the bucket's tokens at last
	last   time.Duration // when tokens was computed

	reading *limits       // what the bucket tells the requests it decided at readAt
	readAt  time.Duration //

	llmTokens float64 // the tokens bucket's tokens (the model's), at last
}

// outcome is what the provider decided for one request when it arrived.
type outcome struct {
	status     int
	retryAfter time.Duration
	latency    time.Duration
	generating bool // the request produces tokens: billed when answered or cut
	truncated  bool
	limits     *limits // the bucket's rate-limit headers; nil when no bucket decided
}

// limits is what a bucket tells every caller it answers, in OpenAI's
// x-ratelimit-*-requests headers: its size, the whole requests left after
// this one, and the time until it is full again, which is what OpenAI
// documents the reset to be (not the time to the next request).
type limits struct {
	limit, remaining int
	reset            time.Duration

	// The tokens bucket's, in x-ratelimit-*-tokens; tokenLimit 0: none.
	tokenLimit, tokenRemaining int
	tokenReset                 time.Duration
}

// bucketLimits reads the bucket as it stands once it has decided the
// requests of this instant. Every request decided at one instant shares
// the reading, which stands as it is after the last of them: which of
// them reached the bucket first is the dispatcher's order, which a replay
// shuffles, and a reading that told them apart would make the outcomes
// hang on it. So each one's remaining counts the others of its instant
// as gone, which can only understate it. The reset is rounded up to the
// millisecond, so that a caller who trusts it is never early;
// Duration.String then formats it as OpenAI does ("1s", "6m0s", "20ms").
func (p *provider) bucketLimits(now time.Duration) *limits {
	if p.reading == nil || p.readAt != now {
		p.reading, p.readAt = &limits{limit: p.Burst}, now
	}
	if p.Rate > 0 {
		p.reading.remaining, p.reading.reset = int(math.Floor(p.tokens)), untilFull(float64(p.Burst)-p.tokens, p.Rate)
	}
	if p.TokenRate > 0 {
		p.reading.tokenLimit = p.TokenBurst
		p.reading.tokenRemaining, p.reading.tokenReset = int(math.Floor(p.llmTokens)), untilFull(float64(p.TokenBurst)-p.llmTokens, p.TokenRate)
	}
	return p.reading
}

// untilFull is the time a bucket missing missing units takes to refill at
// rate a second, rounded up to the millisecond.
func untilFull(missing, rate float64) time.Duration {
	ms := time.Duration(math.Ceil(missing/rate*float64(time.Second)/float64(time.Millisecond))) * time.Millisecond
	return max(ms, 0)
}

// admit decides a request from c that arrives now. It runs on the
// dispatcher.
func (p *provider) admit(c *caller, now time.Duration) outcome {
	for _, ph := range p.Phases {
		if now >= ph.Until {
			continue
		}
		if ph.Status == http.StatusOK {
			break
		}
		switch {
		case ph.Status == http.StatusTooManyRequests:
			return outcome{status: ph.Status, retryAfter: ph.RetryAfter, latency: fail429}
		case ph.Status != 0:
			return outcome{status: ph.Status, retryAfter: ph.RetryAfter, latency: fail503}
		default:
			return outcome{status: http.StatusOK, latency: ph.Hang, generating: true}
		}
	}
	if p.Rate > 0 || p.TokenRate > 0 {
		elapsed := (now - p.last).Seconds()
		p.last = now
		p.tokens = min(float64(p.Burst), p.tokens+p.Rate*elapsed)
		p.llmTokens = min(float64(p.TokenBurst), p.llmTokens+p.TokenRate*elapsed)
		// The time until each bucket holds what the request costs.
		var next float64
		if p.Rate > 0 && p.tokens < 1 {
			next = (1 - p.tokens) / p.Rate
		}
		cost := float64(c.in + c.out)
		if p.TokenRate > 0 && p.llmTokens < cost {
			next = max(next, (cost-p.llmTokens)/p.TokenRate)
		}
		if next > 0 {
			// Retry-After carries whole seconds: round the time to the
			// next token up, so that a caller who honours it finds one.
			return outcome{status: http.StatusTooManyRequests, retryAfter: time.Duration(math.Ceil(next)) * time.Second, latency: fail429,
				limits: p.bucketLimits(now)}
		}
		if p.Rate > 0 {
			p.tokens--
		}
		if p.TokenRate > 0 {
			p.llmTokens -= cost
		}
		return outcome{status: http.StatusOK, latency: p.Answer, generating: true, truncated: p.truncates(c.id),
			limits: p.bucketLimits(now)}
	}
	return outcome{status: http.StatusOK, latency: p.Answer, generating: true, truncated: p.truncates(c.id)}
}

// truncates reports whether this provider cuts request id off at its
// completion budget: a seeded hash of the request, so the same request is
// cut off every time it is sent here.
func (p *provider) truncates(id int) bool {
	if p.Truncate <= 0 {
		return false
	}
	r := rand.New(rand.NewPCG(p.w.seed^0x7472756e63617465, uint64(id)*2+uint64(p.index)))
	return r.Float64() < p.Truncate
}

// RoundTrip plays one request. It returns at once with the context's
// error when the context ends first, as net/http does.
func (p *provider) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	w := p.w
	id, err := strconv.Atoi(req.Header.Get(idHeader))
	if err != nil || id < 0 || id >= len(w.calls) {
		return nil, fmt.Errorf("outage: request without a valid %s header", idHeader)
	}
	c := w.calls[id]
	ctx := req.Context()

	var o outcome
	var send time.Duration
	var refused error
	fi := -1 // this request's index in c.flights
	w.do(c, p.index, func() {
		if err := ctx.Err(); err != nil {
			refused = err // the deadline came first: nothing was sent
			return
		}
		send = w.now()
		o = p.admit(c, send)
		w.sent[p.index]++
		w.count(&w.sentBins, send)
		w.count(&w.sentBinsBy[p.index], send)
		if send < c.raUntil[p.index] {
			c.early++
		}
		fi = len(c.flights)
		c.flights = append(c.flights, flight{send: send, end: -1})
	})
	if refused != nil {
		return nil, refused
	}

	t := time.NewTimer(o.latency)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	var cut error
	w.do(c, p.index, func() {
		end := w.now()
		c.flights[fi].end = end
		// An answer due at the very instant the context ends is cut: the
		// dispatcher sees both, whatever order they woke in.
		if err := ctx.Err(); err != nil {
			cut = err
			if o.generating {
				w.billed++
			}
			return
		}
		if o.generating {
			w.billed++
		}
		if o.status == http.StatusTooManyRequests {
			w.got429++
			w.got429By[p.index]++
			w.count(&w.bins429, send)
			w.count(&w.bins429By[p.index], send)
		}
		if o.retryAfter > 0 {
			c.raUntil[p.index] = max(c.raUntil[p.index], end+o.retryAfter)
		}
	})
	if cut != nil {
		return nil, cut
	}
	return p.response(req, o), nil
}

// response builds the HTTP response for an outcome: a chat completion for
// 200, an error body otherwise.
func (p *provider) response(req *http.Request, o outcome) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if l := o.limits; l != nil {
		// Sent on every answer the buckets decided, 200 and 429 alike, as
		// OpenAI does: the -tokens headers only for a provider with a
		// tokens bucket.
		if l.limit > 0 {
			h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(l.limit))
			h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(l.remaining))
			h.Set("X-Ratelimit-Reset-Requests", l.reset.String())
		}
		if l.tokenLimit > 0 {
			h.Set("X-Ratelimit-Limit-Tokens", strconv.Itoa(l.tokenLimit))
			h.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(l.tokenRemaining))
			h.Set("X-Ratelimit-Reset-Tokens", l.tokenReset.String())
		}
	}
	in, out := 10, 10
	if c := p.caller(req); c != nil {
		in, out = c.in, c.out
	}
	var body string
	if o.status == http.StatusOK {
		finish := "stop"
		if o.truncated {
			finish = "length"
		}
		body = `{"id":"chatcmpl-sim","object":"chat.completion","created":0,"model":"` + p.Name +
			`","choices":[{"index":0,"message":{"role":"assistant","content":"answer"},"finish_reason":"` + finish +
			`","logprobs":null}],"usage":{"prompt_tokens":` + strconv.Itoa(in) + `,"completion_tokens":` + strconv.Itoa(out) +
			`,"total_tokens":` + strconv.Itoa(in+out) + `}}`
	} else {
		if o.retryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(int(o.retryAfter/time.Second)))
		}
		body = `{"error":{"message":"` + http.StatusText(o.status) + `","type":"server_error","code":null,"param":null}}`
	}
	return &http.Response{
		Status:        strconv.Itoa(o.status) + " " + http.StatusText(o.status),
		StatusCode:    o.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// caller is the caller whose request req is; nil when req carries no
// valid number (a test's bare response).
func (p *provider) caller(req *http.Request) *caller {
	if req == nil || p.w == nil {
		return nil
	}
	id, err := strconv.Atoi(req.Header.Get(idHeader))
	if err != nil || id < 0 || id >= len(p.w.calls) {
		return nil
	}
	return p.w.calls[id]
}

// count adds one to the bin of time at.
func (w *world) count(bins *[]int, at time.Duration) {
	i := int(at / bin)
	for len(*bins) <= i {
		*bins = append(*bins, 0)
	}
	(*bins)[i]++
}

// arrivals returns the scenario's seeded arrival times, sorted: those of
// its waves, or Requests in [0, Over).
func (sc *Scenario) arrivals(seed uint64) []time.Duration {
	if len(sc.Waves) == 0 {
		return arrivals(seed, sc.Requests, sc.Over)
	}
	var at []time.Duration
	from := time.Duration(0)
	for i, wv := range sc.Waves {
		for _, a := range arrivals(seed+uint64(i)*0x9e3779b9, wv.Requests, wv.Until-from) {
			at = append(at, from+a)
		}
		from = wv.Until
	}
	return at
}

// arrivals returns n seeded random arrival times in [0, over), sorted, so
// that request numbers follow arrival order.
func arrivals(seed uint64, n int, over time.Duration) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0x6172726976616c73))
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(r.Int64N(int64(over)))
	}
	slices.Sort(at)
	return at
}

// do is a strategy's call: send request id through the library as set up
// for this run, and report which provider answered.
type doFunc func(ctx context.Context, id int) (by int, err error)

// play runs one scenario with one strategy inside the current synctest
// bubble and returns what happened. The dispatcher runs what is due at one
// instant in caller order when order is 0, and otherwise in an order
// shuffled from the seed order.
func play(sc *Scenario, st Strategy, seed, order uint64) *Result {
	w := &world{seed: seed, t0: time.Now(), wake: make(chan struct{}, 1)}
	if order != 0 {
		w.order = rand.New(rand.NewPCG(order, 0x6f72646572))
	}
	specs := sc.providers()
	w.provs = make([]*provider, len(specs))
	for i, spec := range specs {
		w.provs[i] = &provider{Provider: spec, w: w, index: i, tokens: float64(spec.Burst), llmTokens: float64(spec.TokenBurst)}
	}
	w.sent, w.got429By = make([]int, len(specs)), make([]int, len(specs))
	w.sentBinsBy, w.bins429By = make([][]int, len(specs)), make([][]int, len(specs))
	at := sc.arrivals(seed)
	w.calls = make([]*caller, len(at))
	for i, a := range at {
		c := &caller{id: i, arrive: a, by: -1, raUntil: make([]time.Duration, len(specs))}
		c.in, c.out = sc.Tokens.cost(seed, i)
		if sc.Deadline > 0 {
			c.deadline = a + sc.Deadline
		}
		w.calls[i] = c
	}
	stop := make(chan struct{})
	go w.dispatch(stop)

	e := &Env{seed: seed, deadline: sc.Deadline > 0, sc: sc, calls: w.calls,
		transports: make([]http.RoundTripper, len(w.provs)), urls: make([]string, len(w.provs))}
	for i, p := range w.provs {
		e.transports[i] = p
		e.urls[i] = "http://" + strings.ToLower(p.Name) + ".invalid/v1/"
	}
	do := st.build(e)

	finished := make(chan struct{})
	for _, c := range w.calls {
		go func() {
			defer func() { finished <- struct{}{} }()
			time.Sleep(c.arrive)
			ctx := context.Background()
			if sc.Deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, sc.Deadline)
				defer cancel()
			}
			by, err := do(ctx, c.id)
			now := w.now()
			// The answer is recorded on the dispatcher so that the bins
			// are written by one goroutine.
			w.do(c, len(w.provs), func() {
				c.done = now
				if err == nil {
					c.answered, c.by, c.answeredAt = true, by, now
					w.count(&w.ansBins, now)
				}
			})
		}()
	}
	for range w.calls {
		<-finished
	}
	close(stop)
	r := w.result(st)
	if e.storeCalls != nil {
		r.StoreCalls = e.storeCalls()
	}
	return r
}
