package llmretrytest

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// Bucket is a token bucket as providers meter a rate limit with: it holds
// at most Burst units, full at the start, and refills steadily at Rate
// units a second. A request is let through only when the bucket holds
// what it costs, which it then takes. The zero Bucket is no limit.
type Bucket struct {
	Rate  float64 // units added per second; more than 0 (at most 1e9) unless the Bucket is zero
	Burst int64   // the most units the bucket holds; at least 1 unless the Bucket is zero
}

// Limits are the rate limits a model sits behind, as [Server.Limit] sets
// them: a bucket of requests, each request costing 1, and a bucket of
// tokens, each request costing the usage its answer reports. A zero
// Bucket in either is no limit of that kind.
type Limits struct {
	Requests Bucket
	// Tokens are counted as the server's answers report their usage: 10
	// input tokens plus one output token per word of the step's text
	// (per chunk for [StreamDrop] and its kin), so a step that answers
	// nothing, such as [Status], costs 10. The cost is known when the
	// request arrives, so the server decides on it before answering, as
	// providers do with their estimate of a request's tokens. A request
	// that costs more than Tokens.Burst is always refused.
	Tokens Bucket
}

// Limit puts model behind the rate limits l, replacing any it had, with
// its buckets full; Limit with the zero Limits lifts them. Limits last
// across [Server.Script] calls. Limit panics, before changing anything,
// if a Bucket in l is neither zero nor has Rate in (0, 1e9] and Burst at
// least 1, or holds more than a century's refill.
//
// A request for a model behind limits, with a script, is let through
// when every bucket holds what the request costs; it then takes that and
// plays its step. A request a bucket cannot pay for is refused with a
// 429, in the provider's shape (OpenAI: type "requests" or "tokens", code
// "rate_limit_exceeded"; Anthropic: rate_limit_error), logged with the
// Step "status 429 requests" or "status 429 tokens", and does not play
// or use up a step of the script: the model never saw it. The refusal
// says when the buckets will hold enough, in retry-after (whole seconds,
// rounded up) and, from the OpenAI endpoint, retry-after-ms too.
//
// Every response, the steps' answers and errors and the refusals alike,
// carries the rate-limit headers of each limited bucket as the provider
// documents them, as they stand once the request has paid: from the
// OpenAI endpoint x-ratelimit-limit-<b>, x-ratelimit-remaining-<b> and
// x-ratelimit-reset-<b>, the reset the time until the bucket is full
// again as a duration such as "1s", "6m0s" or "20ms" (rounded up to the
// millisecond); from the Anthropic endpoint
// anthropic-ratelimit-<b>-limit, -remaining and -reset, the reset the
// time the bucket is full again in RFC 3339 (rounded up to the second);
// where <b> is "requests" or "tokens". The limit is the Burst, the
// remaining the whole units the bucket holds. A header the step sets
// itself with [Step.WithHeader] is sent instead of the server's.
// Steps that send no response ([Hangup], [Down], [StallHeaders],
// [PartialHeaders]) send no headers, though they paid.
func (s *Server) Limit(model string, l Limits) {
	req := newMeter("Requests", l.Requests)
	tok := newMeter("Tokens", l.Tokens)
	s.mu.Lock()
	defer s.mu.Unlock()
	if req == nil && tok == nil {
		delete(s.limits, model)
		return
	}
	if s.limits == nil {
		s.limits = make(map[string]*limiter)
	}
	s.limits[model] = &limiter{requests: req, tokens: tok}
}

// limiter is one model's buckets; a nil meter is no limit.
type limiter struct {
	requests, tokens *meter
}

// meter is a Bucket at work. It keeps, instead of a count of units and
// the time it was counted, the time at which the bucket will be full
// again (the "theoretical arrival time" of GCRA): what it holds at any
// time follows from that in integer arithmetic, so a test of refill in
// a clock of its own sees exact numbers.
type meter struct {
	burst    int64
	interval time.Duration // the time to refill one unit
	full     time.Time     // when the bucket is full again; at or before now when it is full
}

// newMeter checks b and makes its meter, nil for the zero Bucket; name is
// the field it came from, for the panic.
func newMeter(name string, b Bucket) *meter {
	if b == (Bucket{}) {
		return nil
	}
	interval := time.Duration(0)
	if b.Rate > 0 && b.Rate <= 1e9 { // NaN fails both
		interval = time.Duration(math.Round(float64(time.Second) / b.Rate))
	}
	const century = 100 * 365 * 24 * time.Hour
	if interval <= 0 || b.Burst < 1 || float64(b.Burst)*float64(interval) > float64(century) {
		panic("llmretrytest: Limit: " + name + " Bucket{Rate: " + strconv.FormatFloat(b.Rate, 'g', -1, 64) +
			", Burst: " + strconv.FormatInt(b.Burst, 10) + "}: want Rate in (0, 1e9], Burst at least 1, and no more than a century to fill")
	}
	return &meter{burst: b.Burst, interval: interval}
}

// capacity is the time an empty bucket takes to fill.
func (m *meter) capacity() time.Duration { return time.Duration(m.burst) * m.interval }

// untilFull is the time from now until the bucket is full again.
func (m *meter) untilFull(now time.Time) time.Duration { return max(m.full.Sub(now), 0) }

// remaining is the whole units the bucket holds at now.
func (m *meter) remaining(now time.Time) int64 {
	missing := (m.untilFull(now) + m.interval - 1) / m.interval // a unit partly refilled is not there yet
	return m.burst - int64(missing)
}

// wait is how long from now until the bucket holds n units; 0 when it
// does now. For n above the Burst it is the time until the bucket would
// hold n if it could, which it never will.
func (m *meter) wait(n int64, now time.Time) time.Duration {
	return max(m.untilFull(now)+time.Duration(n)*m.interval-m.capacity(), 0)
}

// take takes n units, which the bucket holds at now.
func (m *meter) take(n int64, now time.Time) {
	m.full = now.Add(m.untilFull(now) + time.Duration(n)*m.interval)
}

// cost is what a request that plays st takes from the tokens bucket: the
// usage its answer reports.
func cost(st Step) int64 { return int64(inputTokens + st.outputTokens()) }

// admit decides, at now, whether a request of api for model that would
// play st is let through its model's limits, and returns the step to play
// with the rate-limit headers added: st when it is let through, a 429 in
// its place when not. The caller holds s.mu.
func (s *Server) admit(model, api string, st Step, now time.Time) (Step, bool) {
	l := s.limits[model]
	if l == nil {
		return st, true
	}
	var reqWait, tokWait time.Duration
	if l.requests != nil {
		reqWait = l.requests.wait(1, now)
	}
	if l.tokens != nil {
		tokWait = l.tokens.wait(cost(st), now)
	}
	admitted := reqWait == 0 && tokWait == 0
	out := st
	switch {
	case admitted:
		if l.requests != nil {
			l.requests.take(1, now)
		}
		if l.tokens != nil {
			l.tokens.take(cost(st), now)
		}
	default:
		out = Status(http.StatusTooManyRequests)
		out.errType = "requests"
		if reqWait == 0 {
			out.errType = "tokens"
		}
		wait := max(reqWait, tokWait)
		secs := (wait + time.Second - 1) / time.Second
		out = out.WithHeader("Retry-After", strconv.FormatInt(int64(secs), 10))
		if api == openAI.name || api == responsesAPI.name {
			ms := (wait + time.Millisecond - 1) / time.Millisecond
			out = out.WithHeader("Retry-After-Ms", strconv.FormatInt(int64(ms), 10))
		}
	}
	// The step's own headers win over the server's; a refusal is not
	// the step, and sends the server's.
	own := make(map[string]bool, len(out.headers))
	for _, kv := range out.headers {
		own[http.CanonicalHeaderKey(kv[0])] = true
	}
	var limitHeaders [][2]string
	for _, b := range []struct {
		name string
		m    *meter
	}{{"requests", l.requests}, {"tokens", l.tokens}} {
		if b.m != nil {
			limitHeaders = append(limitHeaders, rateHeaders(api, b.name, b.m, now)...)
		}
	}
	for _, kv := range limitHeaders {
		if !own[http.CanonicalHeaderKey(kv[0])] {
			out = out.WithHeader(kv[0], kv[1])
		}
	}
	return out, admitted
}

// rateHeaders are the headers by which api's provider reports bucket
// ("requests" or "tokens") as m stands at now.
func rateHeaders(api, bucket string, m *meter, now time.Time) [][2]string {
	if api == gemini.name {
		return nil // the Gemini API sends no rate-limit headers
	}
	limit := strconv.FormatInt(m.burst, 10)
	remaining := strconv.FormatInt(m.remaining(now), 10)
	untilFull := m.untilFull(now)
	if api == openAI.name || api == responsesAPI.name {
		reset := ((untilFull + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
		return [][2]string{
			{"X-Ratelimit-Limit-" + bucket, limit},
			{"X-Ratelimit-Remaining-" + bucket, remaining},
			{"X-Ratelimit-Reset-" + bucket, reset},
		}
	}
	full := now.Add(untilFull).UTC()
	if t := full.Truncate(time.Second); !t.Equal(full) {
		full = t.Add(time.Second)
	}
	prefix := "Anthropic-Ratelimit-" + bucket + "-"
	return [][2]string{
		{prefix + "Limit", limit},
		{prefix + "Remaining", remaining},
		{prefix + "Reset", full.Format(time.RFC3339)},
	}
}
