package llmretry

import "slices"

// plan is the order in which one call tries the backends of its chain:
// every backend in order, then once more the ones it skipped for their
// breakers, when every backend after them failed for a reason about the
// request (otherwise a breaker would turn a primary's recovery into the
// secondary's truncations). A plan is a value, and its methods are pure
// functions of it: no clock, no breaker.
type plan struct {
	n         int   // backends in the chain
	pos       int   // position in the plan
	revisit   []int // backends planned a second time
	deferred  []int // backends skipped for their breakers, not yet revisited, after which no backend failed for its health
	revisited bool  // the second pass has been planned
	others    bool  // the backend at the position is a pool with another deployment to try before waiting for this one's breaker
}

// left is how a call left a backend: all the plan learns from it.
type left struct {
	why     Why  // why the call gave up on it
	kind    Kind // the Kind of its last try; for a skip, of the failure that opened the breaker
	skipped bool // the last try was skipped for the breaker
}

// newPlan is the plan of a call through a chain of n backends.
func newPlan(n int) plan { return plan{n: n} }

// done reports whether the plan has no backend left.
func (p plan) done() bool { return p.pos >= p.n+len(p.revisit) }

// backend is the index of the backend at the plan's position.
func (p plan) backend() int {
	if p.pos >= p.n {
		return p.revisit[p.pos-p.n]
	}
	return p.pos
}

// last reports whether the backend at the plan's position is the last the
// call can try, when it gives up on it after a try of Kind k: a failure
// about the request sends the call back to the backends it skipped, the
// first time it reaches the end.
func (p plan) last(k Kind) bool {
	if p.others {
		return false
	}
	atEnd := p.pos == p.n+len(p.revisit)-1
	return atEnd && (p.revisited || len(p.deferred) == 0 || aboutHealth(k))
}

// next is the plan after the call left backend bi, at the plan's
// position, as l says. After the backend that last called the last, the
// plan is done.
func (p plan) next(bi int, l left) plan {
	secondPass := !p.last(l.kind) && p.pos == p.n+len(p.revisit)-1
	switch {
	case l.why == WhyBreaker, l.why == WhyPaced:
		// Skipped, or left because its breaker would still be open when
		// the retry's wait ended: come back to it. A retry put off so
		// failed for the backend's health, which rules out coming back to
		// those skipped before it.
		if !l.skipped && aboutHealth(l.kind) {
			p.deferred = nil
		}
		p.deferred = append(slices.Clip(p.deferred), bi)
	case aboutHealth(l.kind):
		// The outage is wider than the backends skipped so far: none of
		// them is worth coming back to. One skipped later still may be.
		p.deferred = nil
	}
	if secondPass {
		p.revisit, p.deferred, p.revisited = p.deferred, nil, true
	}
	p.pos++
	return p
}

// aboutHealth reports whether a failure of Kind k says the backend is
// unwell, rather than that it refused or fumbled this request.
func aboutHealth(k Kind) bool { return k == KindTransient || k == KindTimeout }

// sentTo is how many requests the records show sent to backend bi.
func sentTo(attempts []Attempt, bi int) int {
	n := 0
	for i := range attempts {
		if attempts[i].Backend == bi && !attempts[i].Skipped {
			n++
		}
	}
	return n
}
