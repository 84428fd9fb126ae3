package llmretry

import (
	"cmp"
	"time"
)

// The line is the calls of this process that wait for a Breaker: the
// half-open probe goes to the first of them, pacing lets them through in
// their order, and a closing breaker lets them go one at a time. It is a
// FIFO in the order the calls' Do began, kept as heaps so that a
// decision costs O(log n) of the calls waiting: the line's turn decides
// for its first call only (a call that comes back to ask, after a retry's
// wait, is decided for where it stands), and a call is woken, on a
// channel of its own, only when it is let through or dismissed (its
// bound came, or, waiting only for its turn, the breaker stopped letting
// the line go). The Breaker keeps one timer, set to the next time
// the first call's lot can change (a cooldown's end, the provider's next
// admission, the report's window, the next turn), so that no waiting call
// depends on an unrelated event to notice that its time came.

// waiter is a call's place in a Breaker's line.
type waiter struct {
	start time.Time // when the call's Do began: its place in line
	seq   uint64    // orders calls begun at the same time
	ready time.Time // when it comes to the breaker: until then it holds no one up
	end   time.Time // the latest it waits; zero while it does not wait (a retry's wait)
	cost  cost      // what its request is estimated to use

	// Its places in the Breaker's heaps; -1 when not in one.
	pendingAt, lineAt, endAt int

	done    chan struct{} // closed when it was let through or dismissed; nil while it does not wait
	granted bool          // let through: t is its admission
	t       ticket
	v       verdict // what held it back last: its record's reason
	over    bool    // dismissed: the breaker will not let it through within its end
	onTurn  bool    // waits only for its turn among calls the breaker is letting go, whatever bounds it
	gone    bool    // out of line for good
}

// heap is a binary min-heap of waiters, in the order O, that keeps each
// one's place in it, so that any can be taken out in O(log n). Its zero
// value is empty and ready to use.
type heap[O order] struct{ ws []*waiter }

// order is a heap's order: less, and where a waiter keeps its place in
// that heap.
type order interface {
	less(a, b *waiter) bool
	at(w *waiter) *int
}

// byReady orders the calls in a retry's wait by when they come.
type byReady struct{}

func (byReady) less(a, b *waiter) bool { return a.ready.Before(b.ready) }
func (byReady) at(w *waiter) *int      { return &w.pendingAt }

// byStart is line order: by when the call's Do began.
type byStart struct{}

func (byStart) less(a, b *waiter) bool {
	if c := a.start.Compare(b.start); c != 0 {
		return c < 0
	}
	return cmp.Less(a.seq, b.seq)
}
func (byStart) at(w *waiter) *int { return &w.lineAt }

// byEnd orders the calls waiting for the breaker by the end of their
// wait.
type byEnd struct{}

func (byEnd) less(a, b *waiter) bool { return a.end.Before(b.end) }
func (byEnd) at(w *waiter) *int      { return &w.endAt }

func (h *heap[O]) len() int { return len(h.ws) }

// min is the first waiter; nil when there is none.
func (h *heap[O]) min() *waiter {
	if len(h.ws) == 0 {
		return nil
	}
	return h.ws[0]
}

// second is the waiter that comes after min; nil when there is none.
func (h *heap[O]) second() *waiter {
	var o O
	switch len(h.ws) {
	case 0, 1:
		return nil
	case 2:
		return h.ws[1]
	}
	if o.less(h.ws[2], h.ws[1]) {
		return h.ws[2]
	}
	return h.ws[1]
}

// countBefore is how many waiters come before w in the heap's order,
// counting no further than limit: it visits only those it counts, and
// their children.
func (h *heap[O]) countBefore(w *waiter, limit int) int {
	var o O
	n := 0
	next := []int{0}
	for len(next) > 0 && n < limit {
		i := next[len(next)-1]
		next = next[:len(next)-1]
		if i >= len(h.ws) || h.ws[i] == w || !o.less(h.ws[i], w) {
			continue // neither it nor anything under it comes before w
		}
		n++
		next = append(next, 2*i+1, 2*i+2)
	}
	return n
}

// before is the waiters for which in holds, where in holds for a waiter
// whenever it holds for one that comes after it in the heap's order (so
// they are the first ones); it visits only those and their children.
func (h *heap[O]) before(in func(w *waiter) bool) []*waiter {
	var out []*waiter
	next := []int{0}
	for len(next) > 0 {
		i := next[len(next)-1]
		next = next[:len(next)-1]
		if i >= len(h.ws) || !in(h.ws[i]) {
			continue
		}
		out = append(out, h.ws[i])
		next = append(next, 2*i+1, 2*i+2)
	}
	return out
}

func (h *heap[O]) push(w *waiter) {
	var o O
	*o.at(w) = len(h.ws)
	h.ws = append(h.ws, w)
	h.up(len(h.ws) - 1)
}

// remove takes w out, if it is in.
func (h *heap[O]) remove(w *waiter) {
	var o O
	i := *o.at(w)
	if i < 0 || i >= len(h.ws) || h.ws[i] != w {
		return
	}
	last := len(h.ws) - 1
	h.swap(i, last)
	h.ws[last] = nil
	h.ws = h.ws[:last]
	*o.at(w) = -1
	if i < last {
		h.down(i)
		h.up(i)
	}
}

func (h *heap[O]) swap(i, j int) {
	var o O
	h.ws[i], h.ws[j] = h.ws[j], h.ws[i]
	*o.at(h.ws[i]) = i
	*o.at(h.ws[j]) = j
}

func (h *heap[O]) up(i int) {
	var o O
	for i > 0 {
		p := (i - 1) / 2
		if !o.less(h.ws[i], h.ws[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *heap[O]) down(i int) {
	var o O
	for {
		l, m := 2*i+1, i
		if l < len(h.ws) && o.less(h.ws[l], h.ws[m]) {
			m = l
		}
		if r := l + 1; r < len(h.ws) && o.less(h.ws[r], h.ws[m]) {
			m = r
		}
		if m == i {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// line is a Breaker's waiting calls: those still in a retry's wait
// (pending, by when they come), those that have come (queue, in line
// order), and of them those that wait for the breaker (ends, by the end
// of their wait). Its zero value is an empty line.
type line struct {
	pending heap[byReady]
	queue   heap[byStart]
	ends    heap[byEnd]
	seq     uint64
	gate    time.Time // no call of the line is let go before it: the last let go, plus handOff
	turns   int       // calls in queue waiting only for their turn (onTurn)
}

// handOff is the time between the calls a Breaker lets go from its line:
// enough to put them in order, too little to matter next to a model's
// answer. Let go together, they would reach the backend at one instant,
// and which of them a rate-limited backend answered would depend on which
// goroutine ran first.
const handOff = time.Millisecond

// join puts a call begun at start in the line, to come to the breaker
// at ready.
func (l *line) join(start, ready time.Time, c cost) *waiter {
	l.seq++
	w := &waiter{start: start, seq: l.seq, ready: ready, cost: c, pendingAt: -1, lineAt: -1, endAt: -1}
	l.pending.push(w)
	return w
}

// advance moves the calls that have come by now into the queue.
func (l *line) advance(now time.Time) {
	for w := l.pending.min(); w != nil && !w.ready.After(now); w = l.pending.min() {
		l.pending.remove(w)
		l.queue.push(w)
	}
}

// take takes w out of every heap, for good.
func (l *line) take(w *waiter) {
	l.pending.remove(w)
	l.queue.remove(w)
	l.ends.remove(w)
	w.gone = true
}

// first is the first call of the queue; nil when there is none.
func (l *line) first() *waiter { return l.queue.min() }

// waiting is how many calls have come to the breaker.
func (l *line) waiting() int { return l.queue.len() }

// empty reports whether no call stands in the line.
func (l *line) empty() bool { return l.pending.len() == 0 && l.queue.len() == 0 }
