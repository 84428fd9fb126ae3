package llmretry

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The rate-limit headers say how much of a provider's buckets is left. A
// chain that reads them can hold back the requests a bucket would refuse,
// instead of learning of the limit from a 429. This file only reads them:
// parseLimits turns one response's header into a limitReport, a value,
// with no clock of its own and no error; what to do with a report belongs
// to the Breaker.
//
// Two header families are read:
//
//   - OpenAI and Azure OpenAI: x-ratelimit-limit-requests,
//     x-ratelimit-remaining-requests, x-ratelimit-reset-requests, and the
//     same three for -tokens. The reset is a duration such as "1s",
//     "6m0s", "20ms" or "2m59.56s" (see parseResetDuration).
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-{limit,remaining,reset}. The reset is an RFC 3339
//     time such as "2026-12-02T04:30:01Z".
//
// Both providers document the reset as the time until the bucket is full
// again, not until the next request is admitted; nextUnit turns it into
// the latter.

// maxUnits bounds the limit and remaining a header may state. The largest
// documented limits are some hundreds of millions of tokens a minute; a
// number beyond a trillion is not a reading of a real bucket, and keeping
// below it keeps the arithmetic far from overflow.
const maxUnits = 1_000_000_000_000

// maxReset bounds how far ahead a reset (or a Retry-After read with it)
// may lie. The longest window either provider documents is a day
// (requests per day); twice that leaves room for rounding and slow
// clocks, and anything further is not a rate-limit reading.
const maxReset = 48 * time.Hour

// bucketReading is what one response said about one of the provider's
// buckets (requests, or tokens). A reading is known when the header gave
// a usable remaining; a reading that is not known is the zero value, and
// says nothing.
type bucketReading struct {
	known bool
	// limit is the bucket's size; 0 when the header did not state one
	// that could be used (absent, unreadable, absurd, or below
	// remaining).
	limit int64
	// remaining is what the bucket held when the provider answered.
	remaining int64
	// reset is the time from the reading until the bucket is full again,
	// as the provider documents its reset; 0 when it is full already or
	// the header did not say.
	reset time.Duration
	// next is when the provider admits the next unit beyond remaining,
	// by nextUnit; the zero Time when neither a reset nor a Retry-After
	// said.
	next time.Time
}

// limitReport is what one response's header said about the provider's
// rate limits.
type limitReport struct {
	// sent is when the request that drew the response was sent. Reports
	// arrive out of order (a quick 429 after a slow 200), so the Breaker
	// ranks them by it, and counts the requests it let through since.
	sent time.Time
	// read is when the response's header was read; every reset given as
	// a duration is measured from it.
	read time.Time
	// requests and tokens are the two buckets both providers report.
	// For Anthropic, tokens is its most restrictive token limit in
	// effect, as its tokens-* headers say.
	requests, tokens bucketReading
	// inputTokens and outputTokens are Anthropic's separate token
	// buckets; OpenAI has none and leaves them unknown.
	inputTokens, outputTokens bucketReading
	// retryAt is when Retry-After (or retry-after-ms) said to try again,
	// as [ParseRetryAfter] reads it; the zero Time when the response had
	// none or one further than maxReset.
	retryAt time.Time
}

// parseLimits reads the rate-limit headers of one response, sent being
// when its request was sent and read when its header was read. It returns
// false when no bucket reading is known.
//
// The caller passes both times because they answer different questions.
// Which report is freshest, and which requests came after it, is a matter
// of when each request was sent: a 429 that comes back in 0.2 s is fresher
// than a 200 sent two seconds earlier. But a reset given as a duration
// was measured by the provider some time after the send, when it
// answered; measuring it from the send would put every reset early by the
// request's whole latency, and measuring it from the read is never early.
// A read before sent (a clock that stepped back) is taken as sent.
//
// Each value that is absent, unreadable, negative or absurd (a count
// above maxUnits; a reset more than maxReset ahead, or a time more than
// maxReset in the past) is ignored, never an error: a reading without a
// remaining is not known, one without a reset has no next. A header whose
// key has several values is read by its first, as [http.Header.Get] does.
// When one header carries both families for a bucket, which no provider
// sends, the tighter reading wins (see tighter).
//
// The next admission of the requests bucket is also held to Retry-After,
// when the response has one: both say when the provider admits a request,
// and the later is the safe one.
func parseLimits(h http.Header, sent, read time.Time) (limitReport, bool) {
	read = later(read, sent)
	r := limitReport{sent: sent, read: read}
	if h == nil {
		return r, false
	}
	if d, ok := ParseRetryAfter(h, read); ok && d <= maxReset {
		r.retryAt = read.Add(d)
	}
	r.requests = tighter(openAIReading(h, openAIRequests, read), anthropicReading(h, anthropicRequests, read))
	r.tokens = tighter(openAIReading(h, openAITokens, read), anthropicReading(h, anthropicTokens, read))
	r.inputTokens = anthropicReading(h, anthropicInputTokens, read)
	r.outputTokens = anthropicReading(h, anthropicOutputTokens, read)
	if r.requests.known {
		r.requests.next = later(r.requests.next, r.retryAt)
	}
	ok := r.requests.known || r.tokens.known || r.inputTokens.known || r.outputTokens.known
	return r, ok
}

// bucketKeys are the header keys of one bucket's reading, written in
// canonical form so that reading them allocates nothing: every adapter
// reads every response.
type bucketKeys struct{ limit, remaining, reset string }

var (
	openAIRequests        = bucketKeys{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"}
	openAITokens          = bucketKeys{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"}
	anthropicRequests     = bucketKeys{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"}
	anthropicTokens       = bucketKeys{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"}
	anthropicInputTokens  = bucketKeys{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"}
	anthropicOutputTokens = bucketKeys{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"}
)

// openAIReading reads one bucket's OpenAI (and Azure OpenAI) headers,
// x-ratelimit-{limit,remaining,reset}-<bucket>, the reset a duration from
// read.
func openAIReading(h http.Header, k bucketKeys, read time.Time) bucketReading {
	reset, hasReset := parseResetDuration(headerValue(h, k.reset))
	return newReading(headerValue(h, k.limit), headerValue(h, k.remaining), reset, hasReset, read)
}

// anthropicReading reads one bucket's Anthropic headers,
// anthropic-ratelimit-<bucket>-{limit,remaining,reset}, the reset an
// RFC 3339 time.
func anthropicReading(h http.Header, k bucketKeys, read time.Time) bucketReading {
	reset, hasReset := parseResetTime(headerValue(h, k.reset), read)
	return newReading(headerValue(h, k.limit), headerValue(h, k.remaining), reset, hasReset, read)
}

// headerValue is h.Get(key) for a key already in canonical form, without
// canonicalizing it again: that check, on every key of every response,
// was most of what reading the headers cost.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// newReading builds a reading from a bucket's raw limit and remaining and
// its reset, already read as a duration from read.
func newReading(limitText, remainingText string, reset time.Duration, hasReset bool, read time.Time) bucketReading {
	remaining, ok := parseCount(remainingText)
	if !ok {
		return bucketReading{}
	}
	b := bucketReading{known: true, remaining: remaining}
	// A limit of 0 names no bucket, and one below remaining contradicts
	// the reading; without a limit, next falls back to the full reset,
	// which is the later and so the safe reading.
	if limit, ok := parseCount(limitText); ok && limit > 0 && limit >= remaining {
		b.limit = limit
	}
	if hasReset {
		b.reset = reset
		b.next = nextUnit(read, b.limit, b.remaining, reset)
	}
	return b
}

// nextUnit is when a bucket, read at read as holding remaining of limit
// and full again after reset, admits its next unit beyond remaining.
//
// Both providers document the reset as the time until the bucket is full,
// so a bucket that refills steadily gains one unit every
// reset ÷ (limit − remaining), and the first of them comes after that
// long; the quotient is rounded up, never early. Without a limit
// (limit 0), or with a full bucket, there is nothing to divide by, and
// the reset itself, the latest the next unit can come, is the answer.
func nextUnit(read time.Time, limit, remaining int64, reset time.Duration) time.Time {
	if missing := limit - remaining; limit > 0 && missing > 0 {
		n := time.Duration(missing)
		return read.Add((reset + n - 1) / n)
	}
	return read.Add(reset)
}

// tighter is the more restrictive of two readings of one bucket: the one
// with fewer remaining, or on a tie the one whose next unit comes later.
// A reading that is not known loses to one that is.
func tighter(a, b bucketReading) bucketReading {
	switch {
	case !b.known:
		return a
	case !a.known:
		return b
	case a.remaining != b.remaining:
		if a.remaining < b.remaining {
			return a
		}
		return b
	case b.next.After(a.next):
		return b
	}
	return a
}

// later is the later of two times; the zero Time, which stands for "not
// said", is earlier than any reading.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// parseCount reads a limit or remaining: decimal digits only (surrounding
// spaces aside), at most maxUnits. A sign, a fraction, an exponent or
// anything else is not a count.
func parseCount(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if !allDigits(v) {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > maxUnits {
		return 0, false
	}
	return n, true
}

// resetUnits are the units a reset duration may use, longest first.
var resetUnits = []struct {
	name string
	size time.Duration
}{
	{"h", time.Hour},
	{"ms", time.Millisecond}, // before "m", which is its prefix
	{"m", time.Minute},
	{"s", time.Second},
	{"us", time.Microsecond},
	{"µs", time.Microsecond},
	{"ns", time.Nanosecond},
}

// parseResetDuration reads a reset as OpenAI sends it, in the form of
// Go's Duration.String: "1s", "6m0s", "20ms", "1.5s", "2m59.56s",
// "1h2m3s", or "0". It accepts one or more parts, each a decimal number
// (digits, optionally a point and more digits) and a unit (h, m, s, ms,
// us or µs, ns), each unit at most once and longest first, surrounding
// spaces aside. It refuses what time.ParseDuration would also take but no
// provider sends and no bucket means: a sign, a bare number other than 0,
// ".5s", "1.s", "1s1h", spaces inside; and any duration above maxReset.
// Digits finer than a nanosecond are dropped.
func parseResetDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "0" {
		return 0, true
	}
	if v == "" {
		return 0, false
	}
	var total time.Duration
	prev := time.Duration(1<<63 - 1) // the unit of the part before; each part's must be shorter
	for v != "" {
		i := 0
		for i < len(v) && (v[i] >= '0' && v[i] <= '9' || v[i] == '.') {
			i++
		}
		whole, frac, hasPoint := strings.Cut(v[:i], ".")
		if !allDigits(whole) || hasPoint && !allDigits(frac) {
			return 0, false
		}
		v = v[i:]
		size := time.Duration(0)
		for _, u := range resetUnits {
			if strings.HasPrefix(v, u.name) {
				size = u.size
				v = v[len(u.name):]
				break
			}
		}
		if size == 0 || size >= prev {
			return 0, false // no unit, or one that is not shorter than the last (µs after us too)
		}
		prev = size
		if len(whole) > 18 {
			return 0, false // far above maxReset in any unit
		}
		n, _ := strconv.ParseInt(whole, 10, 64) // at most 18 digits: it parses
		if n > int64(maxReset/size) {
			return 0, false
		}
		part := time.Duration(n) * size
		for k, scale := 0, size/10; k < len(frac) && scale > 0; k, scale = k+1, scale/10 {
			part += time.Duration(frac[k]-'0') * scale
		}
		total += part
		if total > maxReset {
			return 0, false
		}
	}
	return total, true
}

// parseResetTime reads a reset as Anthropic sends it, an RFC 3339 time,
// and returns the duration from read until then. A time in the past means
// the bucket is full already, and gives 0; one more than maxReset ahead,
// or more than maxReset in the past, is not a reading.
func parseResetTime(v string, read time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(read) // saturates for times far off
	if d > maxReset || d < -maxReset {
		return 0, false
	}
	return max(d, 0), true
}

// fresher reports whether report a is fresher than b, by the Breaker's
// first rule: its request was sent later, or, sent at the same time, it
// says fewer requests remain. A report of no requests bucket ranks below
// one of the same send that has one: it says nothing of the rate the
// Breaker paces.
func fresher(a, b *limitReport) bool {
	if c := a.sent.Compare(b.sent); c != 0 {
		return c > 0
	}
	return rank(a) < rank(b)
}

// rank orders reports of one send: the fewer requests remaining, the
// lower; a report without a requests reading last.
func rank(r *limitReport) int64 {
	if !r.requests.known {
		return maxUnits + 1
	}
	return r.requests.remaining
}
