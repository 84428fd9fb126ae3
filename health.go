package llmretry

import "time"

// health is a Breaker's closed, open and half-open state (the rules are
// on [Breaker]), as a value that its methods change: what the calls'
// outcomes teach about the backend.
type health struct {
	fails   int       // consecutive retryable failures
	until   time.Time // open until then; zero when closed
	kind    Kind      // the Kind of the failure that opened it
	hinted  bool      // a retry-after hint set until: the provider said when it would be back
	probing bool      // a half-open probe is in flight
	opened  int       // times it has opened, for BreakerState.Opened
}

// outcome is how an attempt that a Breaker let through went, as the
// Breaker learns it.
type outcome struct {
	ok     bool          // a success
	kind   Kind          // else its Kind; KindCancelled when nothing was learned about the backend
	hint   time.Duration // its retry-after hint, if any
	rep    limitReport   // its freshest rate-limit report; valid with hasRep
	hasRep bool
	used   cost // what it used, as its answer said; not known when the zero cost
}

// capWaits holds what o asks the backend to wait to maxWait from now,
// the hint and the report's Retry-After alike: a longer one is a broken
// server's and must not hold the backend back longer. A non-positive
// maxWait caps nothing. It is the one place MaxWait caps a Breaker.
func (o *outcome) capWaits(now time.Time, maxWait time.Duration) {
	if maxWait <= 0 {
		return
	}
	o.hint = min(o.hint, maxWait)
	r := &o.rep.requests
	if o.hasRep && !o.rep.retryAt.IsZero() && r.next.After(now.Add(maxWait)) && !o.rep.retryAt.Before(r.next) {
		r.next = now.Add(maxWait)
	}
}

// observe learns outcome o, of the half-open probe when probe is set,
// at now; failures and cooldown are the Breaker's settings, defaults
// applied. It reports whether the outcome closed an open breaker.
func (h *health) observe(now time.Time, probe bool, o *outcome, failures int, cooldown time.Duration) (closed bool) {
	if probe {
		h.probing = false
	}
	switch {
	case o.ok:
		return h.answered()
	case o.kind == KindCancelled:
		// The caller withdrew, or its own deadline ended the attempt:
		// nothing was learned about the backend. A probe's turn passes to
		// the next call.
	case aboutHealth(o.kind) && o.hint > 0:
		h.fails++
		h.open(now, o.hint, o.kind, true)
	case aboutHealth(o.kind):
		h.fails++
		if probe || h.fails >= failures {
			h.open(now, cooldown, o.kind, false)
		}
	case probe:
		// The backend answered, if not with what was asked: it is up.
		return h.answered()
	}
	return false
}

// answered records that the backend answered: it is up, and the breaker
// closes. It reports whether it was open.
func (h *health) answered() bool {
	wasOpen := !h.until.IsZero()
	h.fails, h.until, h.hinted = 0, time.Time{}, false
	return wasOpen
}

// open keeps the breaker open for at least d from now; hinted says that d
// is a retry-after hint.
func (h *health) open(now time.Time, d time.Duration, kind Kind, hinted bool) {
	until := now.Add(min(d, maxOpen))
	if !now.Before(h.until) {
		// Closed (a zero until) or half-open: this opens it.
		h.opened++
	}
	if until.After(h.until) {
		h.until, h.kind, h.hinted = until, kind, hinted
	}
}

// maxOpen bounds how long anything holds a breaker open, so that adding it
// to a time cannot overflow.
const maxOpen = 100 * 365 * 24 * time.Hour
