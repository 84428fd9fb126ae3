package llmretry

import (
	"cmp"
	"strconv"
	"time"
)

// Deployment is one deployment of a [Backend.Pool]: the same model behind
// another key, region or kind of capacity (an Azure deployment, a second
// OpenAI project, provisioned throughput beside pay-as-you-go). Every
// deployment of a pool must answer a request as well as any other.
type Deployment[Req, Resp any] struct {
	// Name names the deployment in the records ([Attempt.Deployment]),
	// in errors and in telemetry, e.g. "azure-eastus". Required, and
	// unique within its pool.
	Name string
	// Backend is how to call it, as an adapter builds it: its Model,
	// Call, Timeout, StallTimeout, Provider and Stream serve the
	// deployment's requests, and its Breaker (required) is the
	// deployment's health and headroom, shared with every chain that
	// calls the same deployment (with a Store, under its own Key). Its
	// Retry is not used: the pool's backend's is. Its Pool must be empty:
	// a deployment is one deployment, and Validate reports a pool within
	// a pool as an [ErrConfig] error rather than ignore it.
	Backend Backend[Req, Resp]
	// Tier orders the deployments by priority: a request goes to a
	// deployment of a higher tier only when no deployment of a lower one
	// can take it now. 0 is the first; provisioned throughput in tier 0
	// and pay-as-you-go in tier 1 spills over to the latter instead of
	// drawing a 429.
	Tier int
	// Weight is the deployment's share of the requests among deployments
	// of its tier that stand alike (no headroom reported to tell them
	// apart): requests in flight are counted per unit of weight, and so,
	// among deployments that would let a waiting call through alike, are
	// the calls waiting in their lines. 0 means 1.
	Weight int
}

// Chosen says why a request went to the deployment it did
// ([Attempt.Chosen]).
type Chosen string

const (
	ChosenOnly     Chosen = "only"      // no other deployment could take it now
	ChosenTier     Chosen = "tier"      // of the lowest tier of those that could take it, and the only one of that tier
	ChosenHeadroom Chosen = "headroom"  // the most headroom left by its provider's freshest report, of those that could take it
	ChosenInFlight Chosen = "in_flight" // as much headroom as another, and the fewest requests in flight for its weight
	ChosenOrder    Chosen = "order"     // standing alike with another: the first in the pool's order
	ChosenSpill    Chosen = "spill"     // a higher tier: no deployment of a lower one could take it now
	ChosenSoonest  Chosen = "soonest"   // no deployment could take it now: the one that may soonest (see [Backend.Pool]), whose breaker holds it back: a skip, or a wait and the request sent after it
)

// standing is what a deployment's Breaker says of a request that would
// come to it at now: whether it is let through at once, and if not the
// soonest it may be, as far as is known; the share of its provider's buckets left once the requests
// let through are counted (1 when nothing is known); its requests in
// flight; and the calls waiting in its line (the fleet's, with a Store).
type standing struct {
	open     bool
	ready    time.Time // when held back
	headroom float64
	inFlight int64
	ahead    int64
}

// standing reads b's standing at now, as it stands for a call not in its
// line; with a Store, as this process last saw the fleet's state, or as
// the store's newest notice told it ([StateNotifier]), at no store call. A
// request held back is ready once what holds it back has ended, a pace of
// the provider's (a second when it has not said) from now at the
// earliest, and each call ahead of it in line has gone, a pace apart:
// calls waiting in line count as the time they take, so that the waiting
// calls of a pool spread over its deployments as their providers admit
// them.
func (b *Breaker) standing(now time.Time, c cost) standing {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Store != nil {
		b.freshen(now)
		if f := b.fleet; !f.inView && len(f.carry) > 0 {
			// Read as a sync decides: with what this process decided
			// that the store has not taken. The view itself is left
			// without it, for the sync that writes it.
			v := b.view()
			b.applyCarry()
			defer b.restore(v)
		}
	}
	b.line.advance(now)
	k := b.allWaiting()
	v := b.rules(now, k, c)
	s := standing{open: v.pass, headroom: 1, inFlight: b.pacing.inFlight(), ahead: int64(k)}
	if !v.pass {
		pace := b.pacing.pace()
		s.ready = later(v.until, now.Add(pace)).Add(time.Duration(k) * pace)
	}
	if !b.NoPacing {
		s.headroom = b.pacing.headroom(now)
	}
	return s
}

// choice is a deployment chosen for a request, and why.
type choice struct {
	i   int // its index in the pool; -1: every deployment was tried
	why Chosen
}

// now reports whether the deployment chosen can take the request now.
func (c choice) now() bool { return c.i >= 0 && c.why != ChosenSoonest }

// choose picks the deployment of pool that a request goes to, among those
// not in tried, by their standings st (st[i] is read for every i not
// tried): of the lowest tier that has a deployment able to take it now,
// the one with the most headroom, then the fewest in flight for its
// weight, then the first in the pool's order. When none can take it now,
// the one ready soonest, then the one with the fewest calls waiting in
// line for its weight, then the first in order (ChosenSoonest). When
// every deployment was tried it returns the index -1.
func choose[Req, Resp any](pool []Deployment[Req, Resp], st []standing, tried []bool) choice {
	best, soonest := -1, -1
	alike, open := 0, 0 // deployments of the best's tier that could take it; and of any tier
	for i := range pool {
		switch {
		case tried[i]:
			continue
		case !st[i].open:
			if soonest < 0 || sooner(st[i], weight(&pool[i]), st[soonest], weight(&pool[soonest])) > 0 {
				soonest = i
			}
			continue
		}
		open++
		switch {
		case best < 0 || pool[i].Tier < pool[best].Tier:
			best, alike = i, 1
		case pool[i].Tier == pool[best].Tier:
			alike++
			if better(st[i], weight(&pool[i]), st[best], weight(&pool[best])) > 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return choice{i: soonest, why: ChosenSoonest}
	}
	c := choice{i: best, why: ChosenOnly}
	switch {
	case pool[best].Tier > minTier(pool):
		c.why = ChosenSpill
	case alike > 1:
		c.why = reason(pool, st, tried, best)
	case open > 1:
		c.why = ChosenTier
	}
	return c
}

// better compares two deployments' standings for a request, a against b:
// positive when a should take it. Headroom first, then requests in flight
// per unit of weight.
func better(a standing, aw int, b standing, bw int) int {
	if c := cmp.Compare(a.headroom, b.headroom); c != 0 {
		return c
	}
	// a.inFlight/aw < b.inFlight/bw, without division.
	return cmp.Compare(b.inFlight*int64(aw), a.inFlight*int64(bw))
}

// sooner compares two deployments held back, a against b: positive when
// a should take the request. Ready first, then calls waiting in line per
// unit of weight.
func sooner(a standing, aw int, b standing, bw int) int {
	if c := b.ready.Compare(a.ready); c != 0 {
		return c
	}
	return cmp.Compare(b.ahead*int64(aw), a.ahead*int64(bw))
}

// reason is why deployment i won over the others of its tier that could
// take the request, by their standings st.
func reason[Req, Resp any](pool []Deployment[Req, Resp], st []standing, tried []bool, i int) Chosen {
	why := ChosenOrder
	for j := range pool {
		if j == i || tried[j] || pool[j].Tier != pool[i].Tier || !st[j].open {
			continue
		}
		switch {
		case st[i].headroom != st[j].headroom:
			return ChosenHeadroom
		case better(st[i], weight(&pool[i]), st[j], weight(&pool[j])) != 0:
			why = ChosenInFlight
		}
	}
	return why
}

func weight[Req, Resp any](d *Deployment[Req, Resp]) int { return max(d.Weight, 1) }

func minTier[Req, Resp any](pool []Deployment[Req, Resp]) int {
	m := pool[0].Tier
	for i := range pool {
		m = min(m, pool[i].Tier)
	}
	return m
}

// validatePool checks a pool backend's deployments; bad names the backend.
func validatePool[Req, Resp any](pool []Deployment[Req, Resp], bad func(string) error) error {
	seen := make(map[string]bool, len(pool))
	for i := range pool {
		d := &pool[i]
		what := "deployment " + strconv.Itoa(i)
		switch {
		case d.Name == "":
			return bad(what + " has no name")
		case seen[d.Name]:
			return bad(what + " (" + d.Name + "): another deployment has the same name")
		case d.Backend.Call == nil:
			return bad(what + " (" + d.Name + "): call is nil")
		case d.Backend.Breaker == nil:
			return bad(what + " (" + d.Name + "): breaker is nil: a pool chooses by each deployment's breaker")
		case len(d.Backend.Pool) > 0:
			return bad(what + " (" + d.Name + "): has a pool of its own: a deployment is one deployment, and a pool within a pool would never be used")
		case d.Tier < 0 || d.Weight < 0:
			return bad(what + " (" + d.Name + "): tier or weight is negative")
		}
		seen[d.Name] = true
		if p := d.Backend.problem(false); p != "" {
			return bad(what + " (" + d.Name + "): " + p)
		}
	}
	return nil
}

// poolRun is a pool backend's part in one call: its deployments as
// backends of their own under the pool's policy, those a request went to
// since the last wait, and the waits taken.
type poolRun[Req, Resp any] struct {
	b        *Backend[Req, Resp]
	backends []Backend[Req, Resp]
	costs    []cost     // what the call's request is estimated to use on each deployment
	st       []standing // the deployments' standings, as last read
	tried    []bool
	cur      choice    // the deployment of the last request, and why
	waits    int       // the policy's waits taken so far in the call
	hopping  bool      // the last failure goes on to the next deployment at once
	settled  bool      // no deployment could take the request now: it waits for the soonest
	waitedAt time.Time // when the call began to wait for a deployment since the policy's last wait or its last request; zero: it has not
}

// newPoolRun starts b's part in a call of req: each deployment's Estimate
// runs here, once.
func newPoolRun[Req, Resp any](b *Backend[Req, Resp], req Req) *poolRun[Req, Resp] {
	n := len(b.Pool)
	p := &poolRun[Req, Resp]{b: b, backends: make([]Backend[Req, Resp], n), costs: make([]cost, n), st: make([]standing, n), tried: make([]bool, n)}
	for i := range b.Pool {
		p.costs[i] = b.Pool[i].Backend.cost(req)
		p.backends[i] = b.Pool[i].Backend
		p.backends[i].Retry = b.Retry // the pool's policy, for the bounds of its waits
	}
	return p
}

// choose reads the standings of the deployments not tried at now, and
// chooses among them (see choose).
func (p *poolRun[Req, Resp]) choose(now time.Time) choice {
	for i := range p.b.Pool {
		if !p.tried[i] {
			p.st[i] = p.b.Pool[i].Backend.Breaker.standing(now, p.costs[i])
		}
	}
	return choose(p.b.Pool, p.st, p.tried)
}

// target is the deployment the next request goes to, as a backend, and
// what the request is estimated to use there: the best not tried since
// the last wait that can take it now; when none can, the one of them all
// that may soonest, whose breaker then holds the request back (a skip,
// or a wait when the pool is the last backend).
func (p *poolRun[Req, Resp]) target(now time.Time) (*Backend[Req, Resp], cost) {
	c := p.choose(now)
	if !c.now() && !p.settled {
		// None can take it now: wait for the soonest of them all, those
		// whose breakers held it back included.
		p.settled = true
		clear(p.tried)
		c = p.choose(now)
	}
	if c.i < 0 {
		// Every one tried, the states having changed since the last was
		// held back: each may be again.
		clear(p.tried)
		c = p.choose(now)
	}
	p.cur = c
	return &p.backends[c.i], p.costs[c.i]
}

// others reports whether the request, if the deployment chosen for it
// holds it back, has another to go to first rather than wait for this
// one: it was chosen as able to take it now, by this process's reading
// of the fleet's state, which the fleet may have changed since, and
// another deployment of its tier is left to try. (One of a higher tier
// takes it only when the pool's reading says that none of a lower one
// can.) A nil p has none.
func (p *poolRun[Req, Resp]) others() bool {
	if p == nil || p.settled {
		return false
	}
	for i := range p.b.Pool {
		if !p.tried[i] && i != p.cur.i && p.b.Pool[i].Tier == p.b.Pool[p.cur.i].Tier {
			return true
		}
	}
	return false
}

// name writes the deployment of the last request, and why it was chosen,
// into its record a. A nil p writes nothing.
func (p *poolRun[Req, Resp]) name(a *Attempt) {
	if p == nil {
		return
	}
	a.Deployment, a.Chosen = p.b.Pool[p.cur.i].Name, p.cur.why
}

// try is the try number by which the pool's policy reads its next wait:
// the waits taken, plus one, since the requests sent on to the next
// deployment at once take none. For a backend that is no pool, sent.
func (p *poolRun[Req, Resp]) try(sent int) int {
	if p == nil {
		return sent
	}
	return p.waits + 1
}

// hop reports whether failed attempt a, for which the chain decided d,
// goes on at once to the next-best deployment that can take the request
// now: a failure about the deployment's health or limits, in a call that
// retries (not nested), with MaxTries and the reserve allowing another
// request, and another deployment to take it. A nil p is no pool.
func (p *poolRun[Req, Resp]) hop(r *run[Req, Resp], a *Attempt, d decision) bool {
	if p == nil {
		return false
	}
	p.hopping = false
	p.waitedAt = time.Time{} // a request was sent: a wait after it is bounded from when it begins
	switch {
	case !aboutHealth(a.Kind) || r.nested:
		return false
	case d.why == WhyCancelled || d.why == WhyDeadline || d.why == WhyDelivered:
		return false
	case p.b.Retry.MaxTries > 0 && a.Try >= p.b.Retry.MaxTries:
		return false
	case !r.fits(&p.b.Retry, 0, d.at):
		return false
	}
	p.tried[p.cur.i] = true
	if !p.choose(d.at).now() {
		return false
	}
	p.hopping = true
	return true
}

// hopped reports whether the last failure went on to the next deployment.
func (p *poolRun[Req, Resp]) hopped() bool { return p != nil && p.hopping }

// skipped reports whether skip, the record of a request the chosen
// deployment's breaker held back, goes on to the next-best deployment
// instead of ending the call's time on the pool. It does when another
// deployment not tried since the last wait can take the request now
// (this process may have chosen by a state the fleet has since changed),
// and, when the pool is the last backend the call can try, while any is
// left: the one that may take it soonest is waited for next. A skip for
// the caller's deadline or cancel never does. A nil p is no pool.
func (p *poolRun[Req, Resp]) skipped(r *run[Req, Resp], skip *Attempt, now time.Time) bool {
	if p == nil || (skip.Why != WhyBreaker && skip.Why != WhyPaced) {
		return false
	}
	p.tried[p.cur.i] = true
	last := r.plan.last(skip.Kind) && !r.nested
	c := p.choose(now)
	return c.now() || (c.i >= 0 && last)
}

// waited records a wait of the pool's policy taken: every deployment may
// be tried again.
func (p *poolRun[Req, Resp]) waited() {
	if p == nil {
		return
	}
	p.waits++
	clear(p.tried)
	p.settled = false
	p.waitedAt = time.Time{}
}

// waitFrom is when the wait for a breaker that begins at now counts
// from: for a pool, when the call began to wait for the first deployment
// it waited for since the policy's last wait or its last request sent, so that waiting for one
// deployment after another ends when MaxWait from the first has passed,
// as it would on one backend; for a backend that is no pool (nil p), now.
func (p *poolRun[Req, Resp]) waitFrom(now time.Time) time.Time {
	if p == nil {
		return now
	}
	if p.waitedAt.IsZero() {
		p.waitedAt = now
	}
	return p.waitedAt
}
