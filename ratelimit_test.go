package llmretry

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// t0 is the time the tests' requests are sent; their headers are read a
// second later, at t1.
var (
	t0 = time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC)
	t1 = t0.Add(time.Second)
)

func TestParseResetDuration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want time.Duration
		ok   bool
	}{
		{"seconds", "1s", time.Second, true},
		{"minutes_and_seconds", "6m0s", 6 * time.Minute, true},
		{"milliseconds", "20ms", 20 * time.Millisecond, true},
		{"fraction", "1.5s", 1500 * time.Millisecond, true},
		{"minutes_and_fraction", "2m59.56s", 2*time.Minute + 59560*time.Millisecond, true},
		{"two_decimals", "7.66s", 7660 * time.Millisecond, true},
		{"hours", "1h2m3s", time.Hour + 2*time.Minute + 3*time.Second, true},
		{"minutes_then_milliseconds", "1m20ms", time.Minute + 20*time.Millisecond, true},
		{"microseconds", "250us", 250 * time.Microsecond, true},
		{"micro_sign", "250µs", 250 * time.Microsecond, true},
		{"nanoseconds", "1ns", time.Nanosecond, true},
		{"below_a_nanosecond_dropped", "1.0000000009s", time.Second, true},
		{"zero", "0", 0, true},
		{"zero_seconds", "0s", 0, true},
		{"spaces_around", " 1s\t", time.Second, true},
		{"a_day", "24h0m0s", 24 * time.Hour, true},
		{"at_the_bound", "48h", maxReset, true},

		{"empty", "", 0, false},
		{"negative", "-1s", 0, false},
		{"plus", "+1s", 0, false},
		{"bare_number", "5", 0, false},
		{"no_number", "s", 0, false},
		{"leading_point", ".5s", 0, false},
		{"trailing_point", "1.s", 0, false},
		{"two_points", "1.2.3s", 0, false},
		{"unit_twice", "1s1s", 0, false},
		{"units_out_of_order", "1s1h", 0, false},
		{"us_after_micro_sign", "1µs2us", 0, false},
		{"unknown_unit", "1d", 0, false},
		{"space_inside", "1m 2s", 0, false},
		{"exponent", "1e3s", 0, false},
		{"nan", "NaN", 0, false},
		{"garbage", "soon", 0, false},
		{"trailing_garbage", "1sx", 0, false},
		{"absurd", "9999h", 0, false},
		{"just_past_the_bound", "48h0m0.000000001s", 0, false},
		{"absurd_digits", "99999999999999999999999s", 0, false},
		{"absurd_sum", "47h59m99999s", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseResetDuration(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("parseResetDuration(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseResetTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want time.Duration
		ok   bool
	}{
		{"whole_seconds", "2026-12-02T04:30:06Z", 5 * time.Second, true},
		{"fraction", "2026-12-02T04:30:01.25Z", 250 * time.Millisecond, true},
		{"offset", "2026-12-02T05:31:01+01:00", time.Minute, true},
		{"now", "2026-12-02T04:30:01Z", 0, true},
		{"past_is_full", "2026-12-02T04:29:00Z", 0, true},
		{"a_day_ahead", "2026-12-03T04:30:01Z", 24 * time.Hour, true},

		{"empty", "", 0, false},
		{"garbage", "tomorrow", 0, false},
		{"no_zone", "2026-12-02T04:30:06", 0, false},
		{"http_date", "Wed, 02 Dec 2026 04:30:06 GMT", 0, false},
		{"unix_seconds", "1796185806", 0, false},
		{"absurd_future", "9999-12-31T23:59:59Z", 0, false},
		{"absurd_past", "1970-01-01T00:00:00Z", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseResetTime(tc.in, t1)
			if got != tc.want || ok != tc.ok {
				t.Errorf("parseResetTime(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want int64
		ok   bool
	}{
		{"zero", "0", 0, true},
		{"number", "9997", 9997, true},
		{"spaces_around", " 60 ", 60, true},
		{"at_the_bound", "1000000000000", maxUnits, true},

		{"empty", "", 0, false},
		{"negative", "-1", 0, false},
		{"plus", "+1", 0, false},
		{"fraction", "1.5", 0, false},
		{"exponent", "1e6", 0, false},
		{"garbage", "many", 0, false},
		{"absurd", "1000000000001", 0, false},
		{"overflow", "99999999999999999999", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseCount(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("parseCount(%q) = %v, %v, want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// nextUnit reads the reset as the time until the bucket is full: a bucket
// refilling steadily gains a unit every reset ÷ (limit − remaining).
func TestNextUnit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		limit, remaining int64
		reset            time.Duration
		want             time.Duration // after the read
	}{
		// 1 request/s, burst 10, empty: full in 10 s, the next in 1 s.
		{"empty_bucket", 10, 0, 10 * time.Second, time.Second},
		// Half full: five missing over 5 s.
		{"half_full", 10, 5, 5 * time.Second, time.Second},
		// One missing: it is the one that makes the bucket full.
		{"one_missing", 10, 9, 700 * time.Millisecond, 700 * time.Millisecond},
		// 60 a minute: 6m0s until full with 0 of 360 left.
		{"per_minute", 360, 0, 6 * time.Minute, time.Second},
		// Rounded up to the nanosecond, never early.
		{"rounded_up", 3, 0, time.Second, 333333334 * time.Nanosecond},
		// Full: nothing to divide; the reset (0) is the answer.
		{"full", 10, 10, 0, 0},
		// No limit known: the reset itself, the latest the next can come.
		{"no_limit", 0, 0, 10 * time.Second, 10 * time.Second},
		{"no_limit_some_left", 0, 4, 3 * time.Second, 3 * time.Second},
		// A bucket that says it is not full but resets at once.
		{"zero_reset", 10, 2, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := nextUnit(t1, tc.limit, tc.remaining, tc.reset).Sub(t1); got != tc.want {
				t.Errorf("nextUnit(read, %d, %d, %v) = read+%v, want read+%v", tc.limit, tc.remaining, tc.reset, got, tc.want)
			}
		})
	}
}

func TestTighter(t *testing.T) {
	t.Parallel()
	few := bucketReading{known: true, remaining: 1, next: t1.Add(time.Second)}
	many := bucketReading{known: true, remaining: 5, next: t1.Add(time.Minute)}
	fewLater := bucketReading{known: true, remaining: 1, next: t1.Add(2 * time.Second)}
	tests := []struct {
		name string
		a, b bucketReading
		want bucketReading
	}{
		{"neither", bucketReading{}, bucketReading{}, bucketReading{}},
		{"only_a", few, bucketReading{}, few},
		{"only_b", bucketReading{}, few, few},
		{"fewer_remaining_a", few, many, few},
		{"fewer_remaining_b", many, few, few},
		{"tie_later_next_b", few, fewLater, fewLater},
		{"tie_later_next_a", fewLater, few, fewLater},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, tighter(tc.a, tc.b), cmp.AllowUnexported(bucketReading{})); diff != "" {
				t.Errorf("tighter() (-want +got):\n%s", diff)
			}
		})
	}
}

// header builds a header from key, value pairs.
func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseLimits(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) time.Time { return t1.Add(d) }
	tests := []struct {
		name string
		h    http.Header
		want limitReport // sent and read are filled in below
		ok   bool
	}{
		{
			name: "openai",
			h: header(
				"x-ratelimit-limit-requests", "60",
				"x-ratelimit-remaining-requests", "59",
				"x-ratelimit-reset-requests", "1s",
				"x-ratelimit-limit-tokens", "150000",
				"x-ratelimit-remaining-tokens", "149984",
				"x-ratelimit-reset-tokens", "6m0s",
			),
			want: limitReport{
				requests: bucketReading{known: true, limit: 60, remaining: 59, reset: time.Second, next: at(time.Second)},
				// 16 tokens missing, back in 6 minutes: one every 22.5 s.
				tokens: bucketReading{known: true, limit: 150000, remaining: 149984, reset: 6 * time.Minute, next: at(22500 * time.Millisecond)},
			},
			ok: true,
		},
		{
			name: "openai_empty_bucket",
			h: header(
				"x-ratelimit-limit-requests", "10",
				"x-ratelimit-remaining-requests", "0",
				"x-ratelimit-reset-requests", "2m59.56s",
			),
			want: limitReport{
				requests: bucketReading{known: true, limit: 10, remaining: 0, reset: 179560 * time.Millisecond, next: at(17956 * time.Millisecond)},
			},
			ok: true,
		},
		{
			// Azure OpenAI uses OpenAI's names, and often sends only the
			// remaining counts: known, with no next.
			name: "azure_remaining_only",
			h: header(
				"x-ratelimit-remaining-requests", "119",
				"x-ratelimit-remaining-tokens", "119000",
			),
			want: limitReport{
				requests: bucketReading{known: true, remaining: 119},
				tokens:   bucketReading{known: true, remaining: 119000},
			},
			ok: true,
		},
		{
			name: "azure_with_reset",
			h: header(
				"x-ratelimit-limit-requests", "100",
				"x-ratelimit-remaining-requests", "96",
				"x-ratelimit-reset-requests", "20ms",
			),
			want: limitReport{
				requests: bucketReading{known: true, limit: 100, remaining: 96, reset: 20 * time.Millisecond, next: at(5 * time.Millisecond)},
			},
			ok: true,
		},
		{
			name: "anthropic",
			h: header(
				"anthropic-ratelimit-requests-limit", "50",
				"anthropic-ratelimit-requests-remaining", "45",
				"anthropic-ratelimit-requests-reset", "2026-12-02T04:30:06Z",
				"anthropic-ratelimit-tokens-limit", "90000",
				"anthropic-ratelimit-tokens-remaining", "89000",
				"anthropic-ratelimit-tokens-reset", "2026-12-02T04:30:03Z",
				"anthropic-ratelimit-input-tokens-limit", "80000",
				"anthropic-ratelimit-input-tokens-remaining", "79990",
				"anthropic-ratelimit-input-tokens-reset", "2026-12-02T04:30:01.1Z",
				"anthropic-ratelimit-output-tokens-limit", "10000",
				"anthropic-ratelimit-output-tokens-remaining", "10000",
				"anthropic-ratelimit-output-tokens-reset", "2026-12-02T04:30:01Z",
			),
			want: limitReport{
				// 5 missing, full in 5 s.
				requests: bucketReading{known: true, limit: 50, remaining: 45, reset: 5 * time.Second, next: at(time.Second)},
				// 1000 missing, full in 2 s.
				tokens:       bucketReading{known: true, limit: 90000, remaining: 89000, reset: 2 * time.Second, next: at(2 * time.Millisecond)},
				inputTokens:  bucketReading{known: true, limit: 80000, remaining: 79990, reset: 100 * time.Millisecond, next: at(10 * time.Millisecond)},
				outputTokens: bucketReading{known: true, limit: 10000, remaining: 10000, next: t1},
			},
			ok: true,
		},
		{
			name: "anthropic_reset_past_is_full",
			h: header(
				"anthropic-ratelimit-requests-limit", "50",
				"anthropic-ratelimit-requests-remaining", "50",
				"anthropic-ratelimit-requests-reset", "2026-12-02T04:29:00Z",
			),
			want: limitReport{requests: bucketReading{known: true, limit: 50, remaining: 50, next: t1}},
			ok:   true,
		},
		{
			// A 429 says when to come back as well: the later reading wins.
			name: "retry_after_later",
			h: header(
				"retry-after", "2",
				"x-ratelimit-limit-requests", "10",
				"x-ratelimit-remaining-requests", "0",
				"x-ratelimit-reset-requests", "10s",
			),
			want: limitReport{
				requests: bucketReading{known: true, limit: 10, remaining: 0, reset: 10 * time.Second, next: at(2 * time.Second)},
				retryAt:  at(2 * time.Second),
			},
			ok: true,
		},
		{
			name: "retry_after_earlier",
			h: header(
				"retry-after-ms", "300",
				"x-ratelimit-limit-requests", "10",
				"x-ratelimit-remaining-requests", "0",
				"x-ratelimit-reset-requests", "10s",
			),
			want: limitReport{
				requests: bucketReading{known: true, limit: 10, remaining: 0, reset: 10 * time.Second, next: at(time.Second)},
				retryAt:  at(300 * time.Millisecond),
			},
			ok: true,
		},
		{
			// Only a next-request time is known: it is the next.
			name: "retry_after_only_next",
			h: header(
				"retry-after", "3",
				"x-ratelimit-remaining-requests", "0",
			),
			want: limitReport{
				requests: bucketReading{known: true, remaining: 0, next: at(3 * time.Second)},
				retryAt:  at(3 * time.Second),
			},
			ok: true,
		},
		{
			name: "retry_after_alone_is_no_reading",
			h:    header("retry-after", "3"),
			want: limitReport{retryAt: at(3 * time.Second)},
		},
		{
			name: "retry_after_absurd_ignored",
			h: header(
				"retry-after", "1e18",
				"retry-after-ms", "999999999999999",
				"x-ratelimit-remaining-requests", "0",
			),
			want: limitReport{requests: bucketReading{known: true}},
			ok:   true,
		},
		{
			// Both families in one header: the tighter reading.
			name: "both_families",
			h: header(
				"x-ratelimit-remaining-requests", "5",
				"anthropic-ratelimit-requests-remaining", "3",
			),
			want: limitReport{requests: bucketReading{known: true, remaining: 3}},
			ok:   true,
		},
		{
			name: "first_value_read",
			h: header(
				"x-ratelimit-remaining-requests", "7",
				"x-ratelimit-remaining-requests", "0",
			),
			want: limitReport{requests: bucketReading{known: true, remaining: 7}},
			ok:   true,
		},
		{
			name: "limit_below_remaining_dropped",
			h: header(
				"x-ratelimit-limit-requests", "5",
				"x-ratelimit-remaining-requests", "9",
				"x-ratelimit-reset-requests", "4s",
			),
			want: limitReport{requests: bucketReading{known: true, remaining: 9, reset: 4 * time.Second, next: at(4 * time.Second)}},
			ok:   true,
		},
		{
			name: "limit_zero_dropped",
			h: header(
				"x-ratelimit-limit-requests", "0",
				"x-ratelimit-remaining-requests", "0",
				"x-ratelimit-reset-requests", "4s",
			),
			want: limitReport{requests: bucketReading{known: true, reset: 4 * time.Second, next: at(4 * time.Second)}},
			ok:   true,
		},
		{
			name: "absent",
			h:    header("content-type", "application/json"),
		},
		{
			name: "nil_header",
		},
		{
			name: "limit_and_reset_without_remaining",
			h: header(
				"x-ratelimit-limit-requests", "60",
				"x-ratelimit-reset-requests", "1s",
			),
		},
		{
			name: "negative",
			h: header(
				"x-ratelimit-remaining-requests", "-1",
				"anthropic-ratelimit-tokens-remaining", "-5",
			),
		},
		{
			name: "garbage",
			h: header(
				"x-ratelimit-remaining-requests", "lots",
				"x-ratelimit-remaining-tokens", "1e6",
				"anthropic-ratelimit-requests-remaining", "NaN",
			),
		},
		{
			name: "absurd_count",
			h: header(
				"x-ratelimit-remaining-requests", "99999999999999999999",
				"anthropic-ratelimit-tokens-remaining", "1000000000001",
			),
		},
		{
			// The remaining is good; a bad limit or reset is dropped alone.
			name: "bad_limit_and_reset_dropped",
			h: header(
				"x-ratelimit-limit-requests", "-60",
				"x-ratelimit-remaining-requests", "3",
				"x-ratelimit-reset-requests", "-1s",
				"x-ratelimit-limit-tokens", "garbage",
				"x-ratelimit-remaining-tokens", "100",
				"x-ratelimit-reset-tokens", "9999h",
				"anthropic-ratelimit-output-tokens-remaining", "5",
				"anthropic-ratelimit-output-tokens-reset", "9999-12-31T23:59:59Z",
			),
			want: limitReport{
				requests:     bucketReading{known: true, remaining: 3},
				tokens:       bucketReading{known: true, remaining: 100},
				outputTokens: bucketReading{known: true, remaining: 5},
			},
			ok: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.want.sent, tc.want.read = t0, t1
			got, ok := parseLimits(tc.h, t0, t1)
			if ok != tc.ok {
				t.Errorf("parseLimits() ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(limitReport{}, bucketReading{})); diff != "" {
				t.Errorf("parseLimits() (-want +got):\n%s", diff)
			}
		})
	}
}

// A read before the send (a clock that stepped back) is taken as the send,
// so no reset is measured from before the request left.
func TestParseLimitsReadBeforeSent(t *testing.T) {
	t.Parallel()
	h := header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s")
	got, _ := parseLimits(h, t1, t0)
	if got.read != t1 || got.requests.next != t1.Add(time.Second) {
		t.Errorf("parseLimits(h, t1, t0) read %v, next %v; want %v, %v", got.read, got.requests.next, t1, t1.Add(time.Second))
	}
}

// FuzzParseLimits feeds any values to every header parseLimits reads: it
// never panics, a reading that is not known is the zero value, and every
// known one stays within the bounds the Breaker relies on.
func FuzzParseLimits(f *testing.F) {
	f.Add("60", "59", "1s", "2026-12-02T04:30:06Z", "")
	f.Add("10", "0", "2m59.56s", "2026-12-02T04:30:01.25Z", "2")
	f.Add("-1", "-1", "-1s", "9999-12-31T23:59:59Z", "1e18")
	f.Add("99999999999999999999", "1000000000000", "48h", "1970-01-01T00:00:00Z", "NaN")
	f.Add("0", "0", "0", "", "Thu, 01 Jan 1970 00:00:00 GMT")
	f.Add("1000000000000", "1", "47h59m59.999999999s", "2026-12-04T04:30:01Z", "172800")
	f.Add("", "5", "1µs2us", "tomorrow", "\u00a012")
	f.Fuzz(func(t *testing.T, limit, remaining, reset, resetTime, retryAfter string) {
		h := http.Header{}
		for _, bucket := range []string{"requests", "tokens"} {
			h.Set("X-Ratelimit-Limit-"+bucket, limit)
			h.Set("X-Ratelimit-Remaining-"+bucket, remaining)
			h.Set("X-Ratelimit-Reset-"+bucket, reset)
		}
		for _, bucket := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
			h.Set("Anthropic-Ratelimit-"+bucket+"-Limit", limit)
			h.Set("Anthropic-Ratelimit-"+bucket+"-Remaining", remaining)
			h.Set("Anthropic-Ratelimit-"+bucket+"-Reset", resetTime)
		}
		h.Set("Retry-After", retryAfter)
		h.Set("Retry-After-Ms", retryAfter)
		r, ok := parseLimits(h, t0, t1)
		if r.sent != t0 || r.read != t1 {
			t.Errorf("parseLimits() sent, read = %v, %v, want %v, %v", r.sent, r.read, t0, t1)
		}
		if !r.retryAt.IsZero() && (r.retryAt.Before(t1) || r.retryAt.After(t1.Add(maxReset))) {
			t.Errorf("retryAt = %v, want zero or within maxReset after the read", r.retryAt)
		}
		anyKnown := false
		for name, b := range map[string]bucketReading{"requests": r.requests, "tokens": r.tokens, "inputTokens": r.inputTokens, "outputTokens": r.outputTokens} {
			anyKnown = anyKnown || b.known
			if !b.known {
				if b != (bucketReading{}) {
					t.Errorf("%s = %+v, not known but not zero", name, b)
				}
				continue
			}
			if b.remaining < 0 || b.remaining > maxUnits || b.limit < 0 || b.limit > maxUnits || b.limit != 0 && b.limit < b.remaining {
				t.Errorf("%s limit, remaining = %d, %d; out of bounds", name, b.limit, b.remaining)
			}
			if b.reset < 0 || b.reset > maxReset {
				t.Errorf("%s reset = %v, out of [0, maxReset]", name, b.reset)
			}
			if !b.next.IsZero() && (b.next.Before(t1) || b.next.After(t1.Add(maxReset))) {
				t.Errorf("%s next = %v, want zero or within maxReset after the read", name, b.next)
			}
			if b.reset > 0 && b.next.IsZero() {
				t.Errorf("%s has a reset of %v and no next", name, b.reset)
			}
		}
		if ok != anyKnown {
			t.Errorf("parseLimits() ok = %v, want %v", ok, anyKnown)
		}
	})
}

// FuzzParseResetDuration checks the duration parser against the standard
// library's: what it accepts, time.ParseDuration reads as the same
// duration (to the nanosecond its float arithmetic may lose), never
// negative and never above maxReset.
func FuzzParseResetDuration(f *testing.F) {
	for _, s := range []string{"1s", "6m0s", "20ms", "1.5s", "2m59.56s", "1h2m3s", "0", "250µs", "1.0000000009s", "-1s", "1s1h", "48h", "9999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseResetDuration(s)
		if !ok {
			if got != 0 {
				t.Errorf("parseResetDuration(%q) = %v, false; want 0 when refused", s, got)
			}
			return
		}
		if got < 0 || got > maxReset {
			t.Errorf("parseResetDuration(%q) = %v, out of [0, maxReset]", s, got)
		}
		want, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("parseResetDuration(%q) = %v, true; time.ParseDuration refuses it: %v", s, got, err)
		}
		if diff := got - want; diff < -time.Nanosecond || diff > time.Nanosecond {
			t.Errorf("parseResetDuration(%q) = %v, want %v as time.ParseDuration reads it", s, got, want)
		}
	})
}
