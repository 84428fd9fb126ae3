package llmretry

import (
	"net/http"
	"testing"
	"time"
)

// p0 is the send of the report the pacing tests start from.
var p0 = time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC)

// requestsReport is a report of a request sent at sent, read at once,
// that says remaining requests are left and the next comes at next.
func requestsReport(sent time.Time, remaining int64, next time.Time) limitReport {
	return limitReport{sent: sent, read: sent, requests: bucketReading{known: true, remaining: remaining, next: next}}
}

// The admission rule, and the liveness rule beside it, as a table: a
// call is let through when R − S (+1 once T has come) exceeds the calls
// ahead of it in line, or when nothing is in flight, T has come and it is
// first in line. Each row names the rule it leans on.
func TestPaceAdmits(t *testing.T) {
	T := p0.Add(10 * time.Second)
	before, at := p0.Add(time.Second), T
	tests := []struct {
		name      string
		noPacing  bool
		noReport  bool
		remaining int64
		sent      int // requests let through after the report's send (S)
		settled   int // of them, those already back: not in flight
		ahead     int // calls in line before this one, come to the breaker
		now       time.Time
		want      bool
	}{
		{name: "no_report", noReport: true, now: before, want: true},
		{name: "no_pacing", noPacing: true, remaining: 0, now: before, want: true},
		{name: "remaining_left", remaining: 2, now: before, want: true},
		{name: "remaining_used_by_sent", remaining: 2, sent: 2, now: before, want: false},
		{name: "one_left_after_sent", remaining: 2, sent: 1, now: before, want: true},
		{name: "next_admission_come", remaining: 2, sent: 2, now: at, want: true},
		{name: "next_admission_counts_once", remaining: 2, sent: 3, now: at.Add(time.Hour), want: false},
		{name: "ahead_in_line", remaining: 1, ahead: 1, now: before, want: false},
		{name: "room_for_those_ahead", remaining: 2, ahead: 1, now: before, want: true},
		{name: "empty_before_next", remaining: 0, now: before, want: false},
		{name: "empty_at_next", remaining: 0, now: at, want: true},
		{name: "in_flight_at_next", remaining: 0, sent: 1, now: at, want: false},
		{name: "liveness_nothing_in_flight", remaining: 0, sent: 2, settled: 2, now: at, want: true},
		{name: "liveness_needs_next", remaining: 0, sent: 2, settled: 2, now: before, want: false},
		{name: "liveness_first_in_line_only", remaining: 0, sent: 2, settled: 2, ahead: 1, now: at, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Breaker{NoPacing: tc.noPacing}
			if !tc.noReport {
				own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})
				b.pacing.settle(p0.Add(time.Millisecond), own.t, requestsReport(p0, tc.remaining, T), true, cost{})
			}
			var tickets []ticket
			for i := range tc.sent {
				tickets = append(tickets, b.letThrough(p0.Add(time.Duration(i+1)*time.Millisecond), verdict{pass: true}, cost{}).t)
			}
			for _, tk := range tickets[:tc.settled] {
				b.pacing.settle(p0.Add(time.Second), tk, limitReport{}, false, cost{})
			}
			for i := range tc.ahead {
				b.join(p0.Add(time.Duration(i)*time.Millisecond), p0, cost{})
			}
			w := b.join(p0.Add(time.Minute), p0, cost{}) // begun after those ahead
			// Let through, or let go in line order: a handOff after those
			// ahead.
			if v := b.admit(tc.now, w, time.Time{}, cost{}, time.Time{}); (v.pass || v.turn) != tc.want {
				t.Errorf("admit() = %+v, want let through or its turn %v (state %+v)", v, tc.want, b.State())
			}
		})
	}
}

// A call that is not in the line goes after every call in it that has
// come to the breaker.
func TestPaceNotInLineGoesLast(t *testing.T) {
	b := &Breaker{}
	own := b.letThrough(p0, verdict{pass: true}, cost{})
	b.pacing.settle(p0, own.t, requestsReport(p0, 1, p0.Add(time.Hour)), true, cost{})
	b.join(p0, p0, cost{})
	if v := b.admit(p0.Add(time.Second), nil, time.Time{}, cost{}, time.Time{}); v.pass || !v.paced {
		t.Errorf("admit() = %+v, want paced behind the one in line", v)
	}
}

// The freshest report is the one whose request was sent last, whatever
// order they arrive in; of one send, the one with fewer remaining.
func TestPaceFreshestReport(t *testing.T) {
	type rep struct {
		sent      time.Duration // after p0
		remaining int64
	}
	tests := []struct {
		name    string
		arrived []rep // in order of arrival
		want    rep
	}{
		{name: "later_send_arrives_first", arrived: []rep{{sent: 2 * time.Second, remaining: 0}, {sent: 0, remaining: 5}}, want: rep{2 * time.Second, 0}},
		{name: "later_send_arrives_last", arrived: []rep{{sent: 0, remaining: 5}, {sent: 2 * time.Second, remaining: 3}}, want: rep{2 * time.Second, 3}},
		{name: "tie_lower_first", arrived: []rep{{sent: time.Second, remaining: 1}, {sent: time.Second, remaining: 4}}, want: rep{time.Second, 1}},
		{name: "tie_lower_last", arrived: []rep{{sent: time.Second, remaining: 4}, {sent: time.Second, remaining: 1}}, want: rep{time.Second, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Breaker{}
			var tickets []ticket
			for range tc.arrived {
				tickets = append(tickets, b.letThrough(p0, verdict{pass: true}, cost{}).t)
			}
			for i, r := range tc.arrived {
				b.pacing.settle(p0.Add(time.Minute), tickets[i], requestsReport(p0.Add(r.sent), r.remaining, p0.Add(time.Hour)), true, cost{})
			}
			st := b.State()
			if got := (rep{st.Reported.Sub(p0), st.Remaining}); got != tc.want {
				t.Errorf("State() report = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// S counts the requests let through after the report's request was sent,
// and those let through before it that were still in flight then: not
// the report's own, nor one that came back before it. (Before it was let
// through, which is no later than its send: one that came back between
// the two is counted, the safe side.)
func TestPaceCountsFromSend(t *testing.T) {
	b := &Breaker{}
	back := b.letThrough(p0.Add(-4*time.Millisecond), verdict{pass: true}, cost{}) // back before the report's request was let through: the provider had it
	slow := b.letThrough(p0.Add(-3*time.Millisecond), verdict{pass: true}, cost{}) // let through before, but in flight at the send: it may have got there later
	b.pacing.settle(p0.Add(-3*time.Millisecond), back.t, limitReport{}, false, cost{})
	own := b.letThrough(p0.Add(-2*time.Millisecond), verdict{pass: true}, cost{})    // the report's request, let through before its send
	between := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})  // after it, but before its send
	b.letThrough(p0, verdict{pass: true}, cost{})                                    // at the send itself, still in flight
	after := b.letThrough(p0.Add(500*time.Millisecond), verdict{pass: true}, cost{}) // while the report was on its way back
	b.pacing.settle(p0.Add(time.Second), between.t, limitReport{}, false, cost{})
	b.pacing.settle(p0.Add(2*time.Second), own.t, requestsReport(p0, 3, p0.Add(time.Hour)), true, cost{}) // arrives at 2 s: counted from its send, not from then
	b.pacing.settle(p0.Add(3*time.Second), after.t, limitReport{}, false, cost{})
	b.pacing.settle(p0.Add(3*time.Second), slow.t, limitReport{}, false, cost{})
	if got := b.State().LetThrough; got != 4 {
		t.Errorf("State().LetThrough = %d, want 4", got)
	}
}

// The admissions a breaker keeps stay bounded by the requests in flight
// when no report ever comes, as for a backend that sends no headers.
func TestPaceKeepsNoAdmissionsWithoutReports(t *testing.T) {
	b := &Breaker{}
	for i := range 100 {
		v := b.letThrough(p0.Add(time.Duration(i)*time.Millisecond), verdict{pass: true}, cost{})
		b.pacing.settle(p0.Add(time.Duration(i)*time.Millisecond+time.Microsecond), v.t, limitReport{}, false, cost{})
	}
	if n, f := len(b.pacing.recent.at)+b.pacing.recent.folded, b.pacing.inFlight(); n != 0 || f != 0 {
		t.Errorf("after 100 requests without reports: %d admissions kept, %d in flight; want 0, 0", n, f)
	}
}

// StatusFailure reads the rate-limit headers into the Failure, its send
// left for Do to set.
func TestStatusFailureReadsLimits(t *testing.T) {
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Requests", "10")
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	h.Set("X-Ratelimit-Reset-Requests", "5s")
	f := StatusFailure(http.StatusTooManyRequests, h, nil)
	if f.limits == nil || !f.limits.requests.known || f.limits.requests.remaining != 0 || f.limits.requests.limit != 10 {
		t.Fatalf("StatusFailure(429, h).limits = %+v, want requests 0 of 10", f.limits)
	}
	if f := StatusFailure(http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}, nil); f.limits != nil {
		t.Errorf("StatusFailure without rate-limit headers: limits = %+v, want nil", f.limits)
	}
}

// The tokens bucket paces by the same rules, each request counted at the
// use the reports showed: a call waits while the bucket, less that use
// for each request let through since the report, holds less than it and
// each call ahead of it need, until the bucket has refilled enough.
func TestPaceTokens(t *testing.T) {
	const use = 100
	// 250 of 1000 tokens left, full again in 10s: 750 missing, so 50
	// tokens come back after 10s × 50/750.
	refilled := p0.Add(666_666_667)
	tests := []struct {
		name      string
		use       int64
		tokens    int64
		sent      int
		ahead     int
		now       time.Time
		want      bool
		wantUntil time.Time
	}{
		{name: "use_not_known", use: 0, tokens: 0, now: p0, want: true},
		{name: "room", use: use, tokens: 250, now: p0, want: true},
		{name: "room_for_one_ahead", use: use, tokens: 250, ahead: 1, now: p0, want: true},
		{name: "no_room_for_two_ahead", use: use, tokens: 250, ahead: 2, now: p0, want: false, wantUntil: refilled},
		{name: "used_by_sent", use: use, tokens: 250, sent: 2, now: p0, want: false, wantUntil: refilled},
		{name: "refilled", use: use, tokens: 250, sent: 2, now: refilled, want: true},
		{name: "refilled_for_one", use: use, tokens: 250, sent: 2, ahead: 1, now: refilled, want: false},
		// Three requests sent of 250 tokens overdraw the reading by 50:
		// the next goes once 150 have come back, after 10s × 150/750.
		{name: "overdrawn_refilled", use: use, tokens: 250, sent: 3, now: p0.Add(2 * time.Second), want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Breaker{}
			own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})
			r := requestsReport(p0, 100, p0.Add(time.Hour))
			r.tokens = bucketReading{known: true, limit: 1000, remaining: tc.tokens, reset: 10 * time.Second}
			b.pacing.settle(p0, own.t, r, true, cost{})
			b.pacing.tokenUse = tc.use
			for i := range tc.sent {
				b.letThrough(p0.Add(time.Duration(i+1)*time.Millisecond), verdict{pass: true}, cost{})
			}
			for i := range tc.ahead {
				b.join(p0.Add(time.Duration(i)*time.Millisecond), p0, cost{})
			}
			w := b.join(p0.Add(time.Minute), p0, cost{})
			v := b.admit(tc.now, w, time.Time{}, cost{}, time.Time{})
			goes := v.pass || v.turn // let through, or let go in line order: a handOff after those ahead
			if v.turn {
				v.until = time.Time{}
			}
			if goes != tc.want || !v.until.Equal(tc.wantUntil) {
				t.Errorf("admit() goes = %v, until %v; want %v, %v", goes, v.until, tc.want, tc.wantUntil)
			}
		})
	}
}

// A request's use of tokens is learned from the drop between two reports
// over the requests let through between them, rounded up; a report that
// shows no drop (the bucket refilled) leaves the use learned before.
func TestPaceLearnsTokenUse(t *testing.T) {
	b := &Breaker{}
	report := func(tk ticket, sent time.Time, tokens int64) {
		r := requestsReport(sent, 50, p0.Add(time.Hour))
		r.tokens = bucketReading{known: true, limit: 1000, remaining: tokens, reset: time.Minute}
		b.pacing.settle(sent.Add(time.Second), tk, r, true, cost{})
	}
	a := b.letThrough(p0, verdict{pass: true}, cost{})
	report(a.t, p0, 900)
	b.letThrough(p0.Add(time.Millisecond), verdict{pass: true}, cost{})
	c := b.letThrough(p0.Add(2*time.Millisecond), verdict{pass: true}, cost{})
	report(c.t, p0.Add(2*time.Millisecond), 699) // 201 tokens over 2 requests
	if b.pacing.tokenUse != 101 {
		t.Errorf("tokenUse = %d, want 101", b.pacing.tokenUse)
	}
	d := b.letThrough(p0.Add(3*time.Millisecond), verdict{pass: true}, cost{})
	report(d.t, p0.Add(3*time.Millisecond), 800)
	if b.pacing.tokenUse != 101 {
		t.Errorf("after a refill: tokenUse = %d, want 101 still", b.pacing.tokenUse)
	}
}

// An old report does not hold the backend back for good: once the bucket
// could have refilled from empty (W = reset × limit ÷ missing), the limit
// less the requests let through in the last W is room too. A Call that
// reports only its failures (StatusFailure on a 429) otherwise drops to
// one request at a time forever after one 429.
func TestPaceOldReportRefills(t *testing.T) {
	rep := limitReport{sent: p0, read: p0, requests: bucketReading{known: true, limit: 60, remaining: 0, reset: time.Minute, next: p0.Add(time.Second)}}
	b := &Breaker{}
	own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})
	b.pacing.settle(p0, own.t, rep, true, cost{})
	// 100 requests let through and answered over the next minute, with
	// no report: S is far past R.
	for i := range 100 {
		at := p0.Add(time.Duration(i) * 500 * time.Millisecond)
		tk := b.letThrough(at, verdict{pass: true}, cost{})
		b.pacing.settle(at.Add(100*time.Millisecond), tk.t, limitReport{}, false, cost{})
	}
	last := p0.Add(50 * time.Second)                      // the last admission was at 49.5s
	tk := b.letThrough(last, verdict{pass: true}, cost{}) // one still in flight: liveness cannot help
	// In (10s, 70s] the breaker let 80 requests through (10s to 49.5s,
	// and the one at 50s): 60 − 80 < 0, held. In (51s, 111s] none: room.
	if got := b.admit(p0.Add(70*time.Second), nil, time.Time{}, cost{}, time.Time{}).pass; got {
		t.Errorf("admit() at 70s pass = true, want false: 80 requests in the last minute, limit 60")
	}
	if got := b.admit(p0.Add(111*time.Second), nil, time.Time{}, cost{}, time.Time{}).pass; !got {
		t.Errorf("admit() at 111s pass = false, want true: no request in the last minute, limit 60 (state %+v)", b.State())
	}
	b.pacing.settle(p0.Add(112*time.Second), tk.t, limitReport{}, false, cost{})
}

// Liveness looks only at the buckets that hold the call back: a tokens
// reading with room to spare but a refill time ahead must not stop the
// one request that brings a fresh report, with nothing in flight to wake
// the waiter otherwise.
func TestPaceLivenessIgnoresBucketsWithRoom(t *testing.T) {
	rep := limitReport{sent: p0, read: p0,
		requests: bucketReading{known: true, limit: 60, remaining: 0, reset: time.Minute, next: p0.Add(time.Second)},
		tokens:   bucketReading{known: true, limit: 10000, remaining: 9000, reset: 6 * time.Second, next: p0.Add(6 * time.Second)},
	}
	b := &Breaker{pacing: pacing{tokenUse: 1000}}
	own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})
	b.pacing.settle(p0, own.t, rep, true, cost{})
	for i := range 2 { // answered, with no report
		tk := b.letThrough(p0.Add(time.Duration(i+1)*time.Millisecond), verdict{pass: true}, cost{})
		b.pacing.settle(p0.Add(100*time.Millisecond), tk.t, limitReport{}, false, cost{})
	}
	if got := b.admit(p0.Add(2*time.Second), nil, time.Time{}, cost{}, time.Time{}).pass; !got {
		t.Errorf("admit() at 2s pass = false, want true: nothing in flight and T has come (state %+v)", b.State())
	}
}

// A Retry-After past the backend's MaxWait does not hold the backend
// back past MaxWait through pacing, as it does not hold the breaker open.
func TestPaceRetryAfterCappedByMaxWait(t *testing.T) {
	h := http.Header{}
	h.Set("Retry-After", "3600")
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	rep, ok := parseLimits(h, p0, p0)
	if !ok {
		t.Fatal("parseLimits() = false, want a report")
	}
	b := &Breaker{}
	own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, cost{})
	b.observe(p0, own.t, &outcome{kind: KindTransient, rep: rep, hasRep: true}, callBounds{maxWait: 30 * time.Second})
	if got := b.State().NextAdmission; got.After(p0.Add(30 * time.Second)) {
		t.Errorf("State().NextAdmission = %v after the report, want at most MaxWait (30s)", got.Sub(p0))
	}
}

// headroom counts what the tokens bucket refilled since the report was
// read, as it refills steadily to full at its reset: 100 of 1000 tokens
// left, full again in 9 s, is 100 more each second, and full at the
// reset, less the tokens of the requests let through since.
func TestPaceHeadroomCountsTokensRefill(t *testing.T) {
	tests := []struct {
		name string
		sent int // requests of 100 tokens let through since the report
		at   time.Duration
		want float64
	}{
		{name: "at_reading", at: 0, want: 0.1},
		{name: "refilled_4s", at: 4 * time.Second, want: 0.5},
		{name: "refilled_less_sent", sent: 3, at: 4 * time.Second, want: 0.2},
		{name: "full_at_reset", at: 9 * time.Second, want: 1},
		{name: "no_more_than_full", sent: 5, at: time.Minute, want: 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Breaker{}
			c := cost{in: 60, out: 40}
			own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, c)
			b.pacing.settle(p0, own.t, limitReport{sent: p0, read: p0,
				tokens: bucketReading{known: true, limit: 1000, remaining: 100, reset: 9 * time.Second}}, true, cost{})
			for i := range tc.sent {
				b.letThrough(p0.Add(time.Duration(i+1)*time.Millisecond), verdict{pass: true}, c)
			}
			if got := b.pacing.headroom(p0.Add(tc.at)); got != tc.want {
				t.Errorf("headroom() = %v, want %v", got, tc.want)
			}
		})
	}
}

// A tokens bucket refilling since its reading lets one more request
// through each time the refill makes up one request's use: nextChange
// says when, so that a waiting call is woken then, not only at the first
// such time. 100 of 1000 tokens left, full again in 9 s: 100 a second.
func TestPaceNextChangeFollowsTokensRefill(t *testing.T) {
	c := cost{in: 60, out: 40}
	tests := []struct {
		name string
		sent int // requests of 100 tokens let through since the report
		at   time.Duration
		want time.Duration
	}{
		{name: "first_refill", sent: 1, at: 500 * time.Millisecond, want: time.Second},
		{name: "second_refill", sent: 1, at: 1500 * time.Millisecond, want: 2 * time.Second},
		{name: "overdrawn_refilling", sent: 3, at: 2500 * time.Millisecond, want: 3 * time.Second},
		{name: "full_at_reset", sent: 1, at: 8500 * time.Millisecond, want: 9 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Breaker{}
			own := b.letThrough(p0.Add(-time.Millisecond), verdict{pass: true}, c)
			b.pacing.settle(p0, own.t, limitReport{sent: p0, read: p0,
				tokens: bucketReading{known: true, limit: 1000, remaining: 100, reset: 9 * time.Second}}, true, cost{})
			for i := range tc.sent {
				b.letThrough(p0.Add(time.Duration(i+1)*time.Millisecond), verdict{pass: true}, c)
			}
			if got := b.pacing.nextChange(p0.Add(tc.at), c); !got.Equal(p0.Add(tc.want)) {
				t.Errorf("nextChange() = +%v, want +%v", got.Sub(p0), tc.want)
			}
		})
	}
}
