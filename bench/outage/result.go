package outage

import (
	"slices"
	"time"
)

// Result is what one strategy achieved in one scenario. Every count is
// over the whole run.
type Result struct {
	Strategy  string
	Peer      bool          // the strategy is one of the peers, not llmretry
	Breaker   bool          // the strategy is llmretry with its Breaker
	Paced     bool          // the strategy is llmretry with its Breaker, pacing
	Requests  int           // callers
	Answered  int           // answered within their deadline (all answers when there is none)
	ByPrimary int           // of Answered, by the primary
	BySecond  int           // of Answered, by the secondary
	P50       time.Duration // time to answer, over the answered, nearest rank
	P95       time.Duration //
	P99       time.Duration //
	P95Done   time.Duration // time from arrival to the strategy's return, answered or not, over every caller, nearest rank
	Sent      int           // requests that reached a provider
	Billed    int           // answers, truncations and generations cut by a timeout
	Got429    int           // requests answered 429
	Early     int           // requests sent to a provider before the retry-after it gave that caller ran out
	Parked    int           // callers in a wait (no request in flight) when their deadline passed
	SentBins  []int         // requests sent per 10 s
	AnsBins   []int         // answers per 10 s
	Bins429   []int         // requests answered 429, per 10 s of their send

	StoreCalls int64 // calls to the Breakers' shared store (fleet rows with one); 0 without
	Late       int   // callers whose strategy returned after their deadline had passed

	// By provider, in the scenario's order (pool scenarios).
	SentBy, AnsweredBy, Got429By []int
	SentBinsBy, Bins429By        [][]int // requests sent, and answered 429, per 10 s of their send
	Tokens                       int     // the input and output tokens of the requests answered
}

// SentPerAnswer is Sent / Answered; 0 when nothing was answered.
func (r *Result) SentPerAnswer() float64 { return per(r.Sent, r.Answered) }

// BilledPerAnswer is Billed / Answered; 0 when nothing was answered.
func (r *Result) BilledPerAnswer() float64 { return per(r.Billed, r.Answered) }

func per(n, d int) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// result sums up the run.
func (w *world) result(st Strategy) *Result {
	r := &Result{
		Strategy: st.Name,
		Peer:     st.Peer,
		Breaker:  st.Breaker,
		Paced:    st.Paced,
		Requests: len(w.calls),

		Billed:   w.billed,
		Got429:   w.got429,
		SentBins: w.sentBins,
		AnsBins:  w.ansBins,
		Bins429:  w.bins429,

		SentBy:     w.sent,
		AnsweredBy: make([]int, len(w.provs)),
		Got429By:   w.got429By,
		SentBinsBy: w.sentBinsBy,
		Bins429By:  w.bins429By,
	}
	for _, n := range w.sent {
		r.Sent += n
	}
	var times, done []time.Duration
	for _, c := range w.calls {
		r.Early += c.early
		done = append(done, c.done-c.arrive)
		if c.answered && (c.deadline == 0 || c.answeredAt <= c.deadline) {
			r.Answered++
			if c.by == 0 {
				r.ByPrimary++
			} else {
				r.BySecond++
			}
			if c.by >= 0 && c.by < len(r.AnsweredBy) {
				r.AnsweredBy[c.by]++
			}
			r.Tokens += c.in + c.out
			times = append(times, c.answeredAt-c.arrive)
		}
		if c.parked() {
			r.Parked++
		}
		if c.deadline != 0 && c.done > c.deadline {
			r.Late++
		}
	}
	slices.Sort(times)
	r.P50, r.P95, r.P99 = quantile(times, 0.50), quantile(times, 0.95), quantile(times, 0.99)
	slices.Sort(done)
	r.P95Done = quantile(done, 0.95)
	return r
}

// parked reports whether the caller's deadline passed while it was still
// running, unanswered, with no request in flight: it was sitting in a
// wait that could no longer end in an answer.
func (c *caller) parked() bool {
	if c.deadline == 0 || c.answered || c.done < c.deadline {
		return false
	}
	for _, f := range c.flights {
		// A request sent before the deadline and cut at it (or due at
		// it) was in flight when the deadline passed.
		if f.send < c.deadline && f.end >= c.deadline {
			return false
		}
	}
	return true
}

// quantile returns the nearest-rank q-quantile of sorted samples, 0 for
// none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
