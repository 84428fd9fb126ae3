package llmretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry"
)

// The fuzz targets here check what the package promises about input it
// does not control: headers from servers and proxies, dead-letter records
// read back from disk and queues, and errors nested by any library between
// a backend and the chain. Each checks a property against a model written
// from the doc comments, not only that nothing panics. Run one with
//
//	go test -run '^$' -fuzz '^FuzzParseRetryAfter$' -fuzztime 10s .
//
// Without -fuzz, the seeds and testdata/fuzz run as ordinary tests.

// wellFormed is the shape of a hint in seconds or milliseconds that
// ParseRetryAfter documents: digits, optionally a fraction, no sign and no
// exponent.
var wellFormed = regexp.MustCompile(`^([0-9]+)(?:\.([0-9]*))?$`)

// wantAmount is the model of a numeric hint: the exact value of v units
// in nanoseconds, or math.MaxInt64 when that is longer than a Duration
// holds. ok is false when v is not well formed.
func wantAmount(v string, unit time.Duration) (floor time.Duration, saturated, ok bool) {
	m := wellFormed.FindStringSubmatch(strings.TrimSpace(v))
	if m == nil {
		return 0, false, false
	}
	r, _ := new(big.Rat).SetString(m[1] + "." + m[2] + "0")
	r.Mul(r, new(big.Rat).SetInt64(int64(unit)))
	q := new(big.Int).Quo(r.Num(), r.Denom()) // non-negative, so Quo floors
	if !q.IsInt64() || q.Int64() == math.MaxInt64 {
		return math.MaxInt64, true, true
	}
	return time.Duration(q.Int64()), false, true
}

// FuzzParseRetryAfter checks ParseRetryAfter and StatusFailure on any
// status and header values against the documented rules: retry-after-ms
// first, then retry-after as seconds or as an HTTP date; a hint is never
// negative; a well-formed hint too long for a Duration is math.MaxInt64,
// not a wrapped value; a date is the time until it (0 once past); and
// StatusFailure's Kind is ClassifyStatus's (as documented) unless x-should-retry says
// "true" or "false", with RetryAfter what ParseRetryAfter reads.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixNano()
	f.Add(503, "", "120", "", false, int64(0), now)
	f.Add(429, "1500", "7", "true", false, int64(0), now)
	f.Add(500, "1.5", "", "false", false, int64(0), now)
	f.Add(409, "-1", "-1", "TRUE ", false, int64(0), now)
	f.Add(429, "NaN", "1e18", "", false, int64(0), now)
	f.Add(429, "", "NaN", " False", false, int64(0), now)
	f.Add(503, "99999999999999999999999", "", "", false, int64(0), now)
	f.Add(503, "9223372036854", "", "", false, int64(0), now)
	f.Add(503, "9223372036854.775807", "", "", false, int64(0), now)
	f.Add(503, "", "9223372036.854775807", "", false, int64(0), now)
	f.Add(503, "", "9223372036.8547758079999", "", false, int64(0), now)
	f.Add(503, "0.0000001", " 0.9999999999999999999 ", "", false, int64(0), now)
	f.Add(503, "", "١٢٣", "ｔｒｕｅ", false, int64(0), now)
	f.Add(503, "", "\u00a012\u2003", "tru\u0435", false, int64(0), now)
	f.Add(503, "", "", "", true, int64(0), now)            // 1970
	f.Add(503, "", "", "", true, int64(253402300799), now) // 9999-12-31
	f.Add(503, "", "", "", true, now/1e9+90, now)          // in 90 s
	f.Add(503, "", "", "", true, int64(-62135596800), now) // year 1
	f.Add(503, "", "Fri, 31 Dec 9999 23:59:59 GMT", "", false, int64(0), int64(math.MinInt64))
	f.Add(200, "", "Thu, 01 Jan 1970 00:00:00 GMT", "", false, int64(0), int64(math.MaxInt64))
	// Just past what a Duration holds, in each unit and in the fraction.
	f.Add(503, "9223372036855", "", "", false, int64(0), now)
	f.Add(503, "9223372036854.775808", "", "", false, int64(0), now)
	f.Add(503, "9223372036854.9", "", "", false, int64(0), now)
	f.Add(503, "", "9223372037", "", false, int64(0), now)
	f.Add(503, "", "18446744073709551615", "", false, int64(0), now)
	f.Add(503, "", "18446744073709551616", "", false, int64(0), now)
	// The edges of ClassifyStatus's ranges.
	for _, code := range []int{399, 400, 408, 425, 428, 499, 500, 599, 600} {
		f.Add(code, "", "", "", false, int64(0), now)
	}
	f.Add(-1, "", "", "", false, int64(0), now)
	f.Add(math.MaxInt, "", "", "", false, int64(0), now)
	f.Fuzz(func(t *testing.T, code int, ms, ra, should string, date bool, dateUnix, nowNanos int64) {
		h := http.Header{}
		if ms != "" {
			h.Set("Retry-After-Ms", ms)
		}
		if date {
			// Far past and far future dates, in the form servers send.
			ra = time.Unix(dateUnix, 0).UTC().Format(http.TimeFormat)
		}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		if should != "" {
			h.Set("X-Should-Retry", should)
		}
		now := time.Unix(0, nowNanos)

		got, ok := llmretry.ParseRetryAfter(h, now)
		if got < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, want never negative", h, got)
		}
		if !ok && got != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 with false", h, got)
		}
		checkHint(t, h, now, got, ok)

		if d, ok := llmretry.ParseRetryAfter(nil, now); d != 0 || ok {
			t.Fatalf("ParseRetryAfter(nil) = %v, %v; want 0, false", d, ok)
		}

		cause := errors.New("upstream")
		for _, hdr := range []http.Header{h, nil} {
			before := time.Now()
			fl := llmretry.StatusFailure(code, hdr, cause)
			after := time.Now()
			if fl.Status != code || fl.Err != cause || fl.RawText != nil {
				t.Fatalf("StatusFailure(%d, %q, cause) = %+v, want Status %d, Err cause, no RawText", code, hdr, fl, code)
			}
			wantKind := statusKind(code)
			if s := strings.TrimSpace(hdr.Get("X-Should-Retry")); asciiFold(s, "true") {
				wantKind = llmretry.KindTransient
			} else if asciiFold(s, "false") {
				wantKind = llmretry.KindRejected
			}
			if fl.Kind != wantKind {
				t.Errorf("StatusFailure(%d, %q).Kind = %v, want %v", code, hdr, fl.Kind, wantKind)
			}
			// StatusFailure reads the clock itself: its hint lies between
			// what ParseRetryAfter gives at the instants around the call.
			hi, _ := llmretry.ParseRetryAfter(hdr, before)
			lo, _ := llmretry.ParseRetryAfter(hdr, after)
			if fl.RetryAfter < 0 || fl.RetryAfter < lo || fl.RetryAfter > hi {
				t.Errorf("StatusFailure(%d, %q).RetryAfter = %v, want in [%v, %v]", code, hdr, fl.RetryAfter, lo, hi)
			}
		}
	})
}

// checkHint compares ParseRetryAfter's answer with the documented rules.
func checkHint(t *testing.T, h http.Header, now time.Time, got time.Duration, ok bool) {
	t.Helper()
	want := func(floor time.Duration, saturated bool, what string) {
		t.Helper()
		if !ok {
			t.Fatalf("ParseRetryAfter(%q) = false, want the %s hint %v", h, what, floor)
		}
		if saturated {
			if got != math.MaxInt64 {
				t.Fatalf("ParseRetryAfter(%q) = %d, want the %s hint saturated at %d", h, got, what, int64(math.MaxInt64))
			}
			return
		}
		// The fraction is read as a float: allow one nanosecond either way.
		if got < floor-1 || got > floor+1 {
			t.Fatalf("ParseRetryAfter(%q) = %d, want the %s hint %d (±1ns)", h, got, what, floor)
		}
	}
	if floor, sat, isHint := wantAmount(h.Get("Retry-After-Ms"), time.Millisecond); isHint {
		want(floor, sat, "retry-after-ms")
		return
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		if ok {
			t.Fatalf("ParseRetryAfter(%q) = %v, true; want no hint", h, got)
		}
		return
	}
	if floor, sat, isHint := wantAmount(v, time.Second); isHint {
		want(floor, sat, "retry-after seconds")
		return
	}
	when, err := http.ParseTime(v)
	if err != nil {
		if ok {
			t.Fatalf("ParseRetryAfter(%q) = %v, true; want no hint", h, got)
		}
		return
	}
	if !ok {
		t.Fatalf("ParseRetryAfter(%q) = false, want the date %v read", h, when)
	}
	switch {
	case !when.After(now):
		if got != 0 {
			t.Fatalf("ParseRetryAfter(%q) at %v = %v, want 0 for a date past", h, now, got)
		}
	case got == math.MaxInt64:
		// Saturated: the date must lie at least that far ahead.
		if now.Add(math.MaxInt64).After(when) {
			t.Fatalf("ParseRetryAfter(%q) at %v = MaxInt64, but the date is nearer", h, now)
		}
	case !now.Add(got).Equal(when):
		t.Fatalf("ParseRetryAfter(%q) at %v = %v, want the time until %v", h, now, got, when)
	}
}

// asciiFold reports whether s is word, which is lower-case ASCII, in any
// ASCII letter case.
func asciiFold(s, word string) bool {
	if len(s) != len(word) {
		return false
	}
	for i := range len(s) {
		if s[i]|0x20 != word[i] {
			return false
		}
	}
	return true
}

// jsonString is what encoding/json makes of s: each byte that is not
// part of valid UTF-8 becomes U+FFFD.
func jsonString(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// wantRecord is what an attempt should decode back as from its JSON:
// every field as it was, except that the error is a plain one with its
// redacted message, the raw output comes back redacted, strings come back as encoding/json keeps them
// (invalid UTF-8 replaced), and a start whose offset RFC 3339 cannot write
// comes back in UTC.
func wantRecord(a llmretry.Attempt) llmretry.Attempt {
	if a.Err != nil {
		a.Err = errors.New(jsonString(llmretry.Redact(a.Err.Error())))
	}
	if a.RawText != nil {
		raw := jsonString(llmretry.Redact(*a.RawText))
		a.RawText = &raw
	}
	a.Model = jsonString(a.Model)
	a.Next = llmretry.Next(jsonString(string(a.Next)))
	a.Why = llmretry.Why(jsonString(string(a.Why)))
	if _, off := a.Start.Zone(); off%60 != 0 || off <= -day || off >= day {
		a.Start = a.Start.UTC()
	}
	return a
}

// day is a day in seconds, the bound of an offset RFC 3339 can write.
const day = 24 * 60 * 60

// sameInstant compares times as a record keeps them: the instant and the
// zone offset, not the monotonic reading or the Location's name.
var sameInstant = cmp.Comparer(func(x, y time.Time) bool {
	_, xo := x.Zone()
	_, yo := y.Zone()
	return x.Equal(y) && xo == yo
})

// diffAttempt returns the difference between two attempts, errors
// compared by message.
func diffAttempt(want, got llmretry.Attempt) string {
	var d string
	if (want.Err == nil) != (got.Err == nil) || (want.Err != nil && want.Err.Error() != got.Err.Error()) {
		d = fmt.Sprintf("Err: -%v +%v\n", want.Err, got.Err)
	}
	want.Err, got.Err = nil, nil
	return d + cmp.Diff(want, got, sameInstant)
}

// checkDecodeError checks the text of an error UnmarshalJSON returned:
// one line, the package's prefix once, and no name of an internal type.
func checkDecodeError(t *testing.T, data []byte, err error) {
	t.Helper()
	msg := err.Error()
	const prefix = "llmretry: decoding attempt: "
	if !strings.HasPrefix(msg, prefix) || strings.Count(msg, "llmretry:") != 1 || strings.Contains(msg, "\n") {
		t.Errorf("UnmarshalJSON(%q) error = %q, want one line that says %q once, at its start", data, msg, prefix)
	}
	for _, internal := range []string{"attemptJSON", "msec", "llmretry.", "Go value", "Go struct"} {
		if strings.Contains(msg, internal) {
			t.Errorf("UnmarshalJSON(%q) error = %q names %q, an internal type", data, msg, internal)
		}
	}
}

// FuzzAttemptJSON checks Attempt's JSON on two fronts. Bytes from a
// damaged record never make UnmarshalJSON panic; when they decode, the
// attempt encodes, that encoding decodes to the same attempt and encodes
// the same again (what UnmarshalJSON accepts, MarshalJSON writes back);
// when they do not, the error reads as documented. An attempt built from
// fuzzed fields (durations of any sign and length, any strings, Kinds,
// Next and Why values, starts in any offset and year) decodes back from
// its encoding exactly, and MarshalJSON refuses it only for a year that
// RFC 3339 cannot write, which UnmarshalJSON refuses too.
func FuzzAttemptJSON(f *testing.F) {
	f.Add([]byte(`{"backend":1,"model":"m","try":2,"kind":"transient","status":503,"error":"http 503: x","raw_text":"","start":"2026-11-30T12:00:00.5+01:00","elapsed_ms":1.5,"retry_after_ms":9223372036854.775807,"next":"retry","retry_in_ms":30,"delivered":false}`),
		1, 2, 503, uint8(1), "gpt", "http 503: upstream", "partial", true, true, int64(1764500000123456789), int16(60), int64(1500000), int64(math.MaxInt64), int64(30e6), "retry", "", false, false, int16(0))
	f.Add([]byte(`{"kind":"kind(255)","elapsed_ms":1e300}`),
		0, 1, 0, uint8(255), "", "", "", false, false, int64(0), int16(0), int64(0), int64(0), int64(0), "", "", false, false, int16(0))
	f.Add([]byte(`{"elapsed_ms":-0,"retry_in_ms":0.0000005,"retry_after_ms":1E-7,"kind":"parse"}`),
		-1, -1, -1, uint8(4), "\xff\xfe", "Post \"https://u:p@h/?key=sk\": EOF", "\xc3", true, true, int64(-1), int16(-1439), int64(-1), int64(math.MinInt64), int64(1), "fail_over", "not_retryable", true, true, int16(0))
	f.Add([]byte(`{"error":"Bearer abc sk-Zq81Lw02Xe93Rt64Yu75","start":"0000-01-01T00:00:00+00:01","next":"stop","why":"deadline"}`),
		0, 1, 429, uint8(6), "m", "Authorization: Bearer abc", "", true, false, int64(math.MaxInt64), int16(1439), int64(999999), int64(1), int64(1), "stop", "cancelled", false, true, int16(7700))
	// Raw output that echoes a key, read and written: it comes back redacted.
	f.Add([]byte(`{"kind":"parse","raw_text":"your key sk-Zq81Lw02Xe93Rt64Yu75 and Bearer abc"}`),
		0, 1, 200, uint8(4), "m", "invalid JSON", "your key sk-Zq81Lw02Xe93Rt64Yu75 and Bearer abc", true, true, int64(0), int16(0), int64(0), int64(0), int64(0), "stop", "not_retryable", false, false, int16(0))
	// A Kind a custom Classify returned, outside the constants.
	f.Add([]byte(`{"kind":"kind(200)","error":""}`),
		0, 1, 0, uint8(200), "m", "", "", true, false, int64(0), int16(0), int64(0), int64(0), int64(0), "stop", "", false, false, int16(-2100))
	// A record of a failure with no error, which still keeps its Kind.
	f.Add([]byte(`{"kind":"rejected","next":"fail_over","why":"not_retryable"}`),
		0, 1, 400, uint8(5), "m", "", "", false, false, int64(0), int16(0), int64(0), int64(0), int64(0), "fail_over", "not_retryable", false, false, int16(0))
	f.Add([]byte(`{"elapsed_ms":9223372036854.7758075}`),
		0, 0, 0, uint8(0), "", "", "", false, false, int64(0), int16(0), int64(0), int64(0), int64(0), "", "", false, false, int16(0))
	f.Add([]byte(`{"start":null,"kind":null,"error":null,"elapsed_ms":null,"model":"\ud800"}`),
		0, 0, 0, uint8(0), "", "", "", false, false, int64(0), int16(0), int64(0), int64(0), int64(0), "weird next", "", false, false, int16(0))
	// Negative durations, the longest of them, and an offset with seconds.
	f.Add([]byte(`{"elapsed_ms":-9223372036854.775808,"retry_in_ms":-0.000001,"backend":"1"}`),
		0, 1, 0, uint8(3), "m", "", "", false, false, int64(1), int16(-7), int64(math.MinInt64), int64(-1), int64(-999999), "", "", false, false, int16(0))
	// A success with a status, and a record with a Kind and nothing else.
	f.Add([]byte(`{"status":200,"try":1.5,"delivered":"yes"}`),
		0, 1, 200, uint8(0), "m", "", "", false, false, int64(5), int16(0), int64(1), int64(0), int64(0), "", "", true, false, int16(0))
	f.Add([]byte(`[{"kind":"timeout"}]`),
		0, 1, 0, uint8(2), "m", "", "", false, false, int64(5), int16(1440), int64(1), int64(0), int64(0), "", "", false, false, int16(0))
	f.Fuzz(func(t *testing.T, data []byte,
		backend, try, status int, kind uint8, model, msg, raw string, hasErr, hasRaw bool,
		startNanos int64, zoneMinutes int16, elapsed, retryAfter, retryIn int64,
		next, why string, delivered, skipped bool, years int16,
	) {
		// Bytes from a damaged or hostile record.
		var a llmretry.Attempt
		if err := a.UnmarshalJSON(data); err == nil {
			checkStable(t, a)
		} else {
			checkDecodeError(t, data, err)
		}

		// An attempt built from fuzzed fields. The offset may be in
		// minutes under a day, which RFC 3339 writes, or not.
		off := int(zoneMinutes) * 60
		if zoneMinutes%3 == 1 {
			off += int(zoneMinutes % 60) // seconds too
		}
		zone := time.UTC
		if off != 0 {
			zone = time.FixedZone("", off)
		}
		b := llmretry.Attempt{
			Backend:    backend,
			Model:      model,
			Try:        try,
			Kind:       llmretry.Kind(kind),
			Status:     status,
			Elapsed:    time.Duration(elapsed),
			RetryAfter: time.Duration(retryAfter),
			Next:       llmretry.Next(next),
			Why:        llmretry.Why(why),
			RetryIn:    time.Duration(retryIn),
			Delivered:  delivered,
			Skipped:    skipped,
		}
		if startNanos != 0 || years != 0 {
			b.Start = time.Unix(0, startNanos).In(zone).AddDate(int(years), 0, 0)
		}
		if hasErr {
			b.Err = errors.New(msg)
		}
		if hasRaw {
			b.RawText = &raw
		}
		enc, err := json.Marshal(b)
		if y := wantRecord(b).Start.Year(); y < 0 || y > 9999 {
			// Refused on both sides: the time as RFC 3339 would write it
			// does not decode either.
			if err == nil {
				t.Fatalf("json.Marshal() of a start in year %d = %s, want an error", y, enc)
			}
			if !strings.Contains(err.Error(), "llmretry: encoding attempt: ") {
				t.Errorf("json.Marshal() error = %q, want it to say %q", err, "llmretry: encoding attempt: ")
			}
			ts := wantRecord(b).Start.Format(time.RFC3339Nano)
			in := []byte(`{"start":"` + ts + `"}`)
			var back llmretry.Attempt
			if err := back.UnmarshalJSON(in); err == nil {
				t.Errorf("UnmarshalJSON(%s) = nil error, want one: MarshalJSON refuses that time", in)
			} else {
				checkDecodeError(t, in, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("json.Marshal(%#v) error: %v", b, err)
		}
		var got llmretry.Attempt
		if err := json.Unmarshal(enc, &got); err != nil {
			t.Fatalf("json.Unmarshal(%s) error: %v", enc, err)
		}
		if d := diffAttempt(wantRecord(b), got); d != "" {
			t.Errorf("decode(encode(a)) differs from a (-want +got), encoding %s:\n%s", enc, d)
		}
		// A success's record has no kind, and no status unless it has one.
		if b.Err == nil && b.Next == "" && b.Kind == 0 {
			if bytes.Contains(enc, []byte(`"kind"`)) || (b.Status == 0 && bytes.Contains(enc, []byte(`"status"`))) {
				t.Errorf("json.Marshal() of a success = %s, want no kind and no zero status", enc)
			}
		}
		checkStable(t, got)
	})
}

// checkStable checks that a decoded attempt encodes, that the encoding
// decodes to the same attempt, and that it encodes the same again.
func checkStable(t *testing.T, a llmretry.Attempt) {
	t.Helper()
	enc1, err := json.Marshal(a)
	if err != nil {
		t.Fatalf("json.Marshal(%#v) of a decoded attempt error: %v", a, err)
	}
	var b llmretry.Attempt
	if err := json.Unmarshal(enc1, &b); err != nil {
		t.Fatalf("json.Unmarshal(%s) of an encoded attempt error: %v", enc1, err)
	}
	if d := diffAttempt(wantRecord(a), b); d != "" {
		t.Errorf("decode(encode(a)) differs from a decoded attempt (-want +got), encoding %s:\n%s", enc1, d)
	}
	enc2, err := json.Marshal(b)
	if err != nil {
		t.Fatalf("json.Marshal(%#v) error: %v", b, err)
	}
	if string(enc1) != string(enc2) {
		t.Errorf("encoding not stable:\nfirst  %s\nsecond %s", enc1, enc2)
	}
}

// fuzzBytes hands out a fuzz input's bytes as choices; once they run out,
// every choice is 0.
type fuzzBytes []byte

func (r *fuzzBytes) byte() byte {
	if len(*r) == 0 {
		return 0
	}
	c := (*r)[0]
	*r = (*r)[1:]
	return c
}

func (r *fuzzBytes) pick(n int) int { return int(r.byte()) % n }

func (r *fuzzBytes) int64() int64 {
	var v uint64
	for range 8 {
		v = v<<8 | uint64(r.byte())
	}
	return int64(v)
}

var (
	fuzzNexts = []llmretry.Next{"", llmretry.NextRetry, llmretry.NextFailOver, llmretry.NextStop, "odd"}
	fuzzWhys  = []llmretry.Why{"", llmretry.WhyNotRetryable, llmretry.WhyWaitsUsed, llmretry.WhyReserve,
		llmretry.WhyMaxWait, llmretry.WhyDelivered, llmretry.WhyDeadline, llmretry.WhyCancelled,
		llmretry.WhyNested, llmretry.WhyBreaker}
	fuzzStatuses = []int{0, 200, 400, 408, 409, 425, 429, 499, 500, 503, 599, 600, -1}
)

// fuzzAttempts builds up to six attempts from r, their texts taken from
// the pieces of texts split at '|'.
func fuzzAttempts(r *fuzzBytes, texts string) []llmretry.Attempt {
	pieces := strings.Split(texts, "|")
	text := func() string { return pieces[r.pick(len(pieces))] }
	n := r.pick(7)
	if n == 0 {
		return nil
	}
	attempts := make([]llmretry.Attempt, n)
	for i := range attempts {
		a := &attempts[i]
		a.Backend = r.pick(4)
		a.Model = text()
		a.Try = 1 + r.pick(3)
		a.Kind = llmretry.Kind(r.pick(9)) // 7 and 8 lie outside the constants
		a.Status = fuzzStatuses[r.pick(len(fuzzStatuses))]
		switch r.pick(4) {
		case 1:
			a.Err = errors.New(text())
		case 2:
			a.Err = llmretry.StatusFailure(a.Status, nil, errors.New(text()))
		case 3:
			a.Err = fmt.Errorf("wrapped: %w", llmretry.ParseFailure(text(), io.ErrUnexpectedEOF))
		}
		if r.pick(2) == 1 {
			raw := text()
			a.RawText = &raw
		}
		if s := r.int64(); s != 0 {
			a.Start = time.Unix(0, s).UTC()
		}
		a.Elapsed = time.Duration(r.int64())
		a.RetryAfter = time.Duration(r.int64())
		a.Next = fuzzNexts[r.pick(len(fuzzNexts))]
		a.Why = fuzzWhys[r.pick(len(fuzzWhys))]
		if a.Next == llmretry.NextRetry {
			a.RetryIn = time.Duration(r.int64())
		}
		a.Delivered = r.pick(2) == 1
		a.Skipped = r.pick(4) == 1
	}
	return attempts
}

// deadLetter is a dead-letter record as a consumer that knows nothing of
// llmretry beyond Attempt reads it back.
type deadLetter struct {
	Outcome       string             `json:"outcome"`
	ItemRetryable bool               `json:"item_retryable"`
	Error         string             `json:"error"`
	Cause         string             `json:"cause,omitempty"`
	Usage         *llmretry.Usage    `json:"usage,omitempty"`
	UsageUnknown  int                `json:"usage_unknown"`
	Attempts      []llmretry.Attempt `json:"attempts"`
}

// noUsage reports whether no attempt carries a usage.
func noUsage(attempts []llmretry.Attempt) bool {
	for i := range attempts {
		if attempts[i].Usage != nil {
			return false
		}
	}
	return true
}

// FuzzDeadLetterJSON checks the dead-letter records of the chain's four
// error types, built from fuzzed attempts: the record decodes with plain
// encoding/json, says the outcome of the error's type and the advice of
// RetryItem, holds the redacted message and cause and every attempt as
// it was, and encodes back to the same bytes.
func FuzzDeadLetterJSON(f *testing.F) {
	f.Add([]byte{}, uint8(0), "", "", false)
	f.Add([]byte{3, 1, 0, 5, 4, 1, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 0, 3, 1, 0, 1, 5, 3, 2},
		uint8(0), "gpt|http 400: context too long|sk-Zq81Lw02Xe93Rt64Yu75Io86", "", false)
	f.Add([]byte{2, 0, 0, 0, 3, 3, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},
		uint8(1), "m|partial \xff output", "custom\nsummary https://u:p@h/", false)
	// One truncated attempt, in a plain Exhausted: not worth running again.
	f.Add([]byte{1, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},
		uint8(0), "m|length", "", false)
	f.Add([]byte{4, 2, 1, 1, 2, 7, 1, 0, 255, 255, 255, 255, 255, 255, 255, 255, 1, 1, 1, 1, 1, 1, 1, 1},
		uint8(2), "a|b|c", "", true)
	f.Add([]byte{1, 0, 0, 0, 6, 0, 0}, uint8(3), "x", "Bearer tok", true)
	// One parse failure whose raw output is a pasted key.
	f.Add([]byte{1, 0, 0, 0, 4, 0, 3, 1, 1}, uint8(0), "sk-Zq81Lw02Xe93Rt64Yu75Io86", "", false)
	f.Add([]byte{6, 1, 1, 1, 3, 5, 2, 1, 2, 2, 1, 4, 4, 3, 1, 3, 2, 2, 8, 6},
		uint8(4), "\x00|\"|\\u0026key=v", "", false)
	f.Fuzz(func(t *testing.T, choices []byte, which uint8, texts, summary string, hasCause bool) {
		r := fuzzBytes(choices)
		attempts := fuzzAttempts(&r, texts)
		var cause error
		if hasCause {
			cause = fmt.Errorf("caller: %s", summary)
		}
		var (
			err         error
			wantOutcome string
		)
		switch which % 5 {
		case 0:
			err, wantOutcome = &llmretry.Exhausted{Attempts: attempts}, "exhausted"
		case 1:
			err, wantOutcome = &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}, "truncated"
		case 2:
			err, wantOutcome = &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}, Cause: cause}, "timed_out"
		case 3:
			err, wantOutcome = &llmretry.Cancelled{Attempts: attempts, Cause: cause}, "cancelled"
		case 4:
			// Exhaust picks the type; the outcome must name the one it picked.
			err = llmretry.Exhaust(attempts)
			switch err.(type) {
			case *llmretry.Truncated:
				wantOutcome = "truncated"
			case *llmretry.TimedOut:
				wantOutcome = "timed_out"
			case *llmretry.Exhausted:
				wantOutcome = "exhausted"
			default:
				t.Fatalf("Exhaust() = %T, want one of the Exhausted family", err)
			}
		}

		enc, jerr := json.Marshal(err)
		if jerr != nil {
			t.Fatalf("json.Marshal(%T) error: %v", err, jerr)
		}
		var rec deadLetter
		if jerr := json.Unmarshal(enc, &rec); jerr != nil {
			t.Fatalf("json.Unmarshal(%s) error: %v", enc, jerr)
		}
		if rec.Outcome != wantOutcome {
			t.Errorf("outcome = %q, want %q for %T", rec.Outcome, wantOutcome, err)
		}
		if want := llmretry.RetryItem(err); rec.ItemRetryable != want {
			t.Errorf("item_retryable = %v, want RetryItem() = %v", rec.ItemRetryable, want)
		}
		if want := wantAdvice(rec.Outcome, attempts); rec.ItemRetryable != want {
			t.Errorf("item_retryable = %v for %s, want %v as documented", rec.ItemRetryable, rec.Outcome, want)
		}
		if want := jsonString(err.Error()); rec.Error != want {
			t.Errorf("error = %q, want %q", rec.Error, want)
		}
		wantCause := ""
		if _, ok := err.(*llmretry.Cancelled); ok || which%5 == 2 {
			if cause != nil {
				wantCause = jsonString(llmretry.Redact(cause.Error()))
			}
		}
		if rec.Cause != wantCause {
			t.Errorf("cause = %q, want %q", rec.Cause, wantCause)
		}
		wantTotal, wantUnknown := llmretry.TotalUsage(attempts)
		if rec.UsageUnknown != wantUnknown {
			t.Errorf("usage_unknown = %d, want %d", rec.UsageUnknown, wantUnknown)
		}
		if got := rec.Usage; (got == nil) != noUsage(attempts) || (got != nil && *got != wantTotal) {
			t.Errorf("usage = %+v, want %+v", got, wantTotal)
		}
		if len(rec.Attempts) != len(attempts) || rec.Attempts == nil {
			t.Fatalf("attempts = %d records (nil %v), want %d and never null", len(rec.Attempts), rec.Attempts == nil, len(attempts))
		}
		for i := range attempts {
			if d := diffAttempt(wantRecord(attempts[i]), rec.Attempts[i]); d != "" {
				t.Errorf("attempt %d differs (-want +got):\n%s", i, d)
			}
		}
		// An orchestrator reading the record back can rederive the
		// advice of an Exhausted from the kinds its attempts kept.
		if wantOutcome == "exhausted" {
			if got := (&llmretry.Exhausted{Attempts: rec.Attempts}).ItemRetryable(); got != rec.ItemRetryable && allFailed(attempts) {
				t.Errorf("advice rederived from the record = %v, want item_retryable %v", got, rec.ItemRetryable)
			}
		}
		// Re-encoded, the record says the same; byte for byte once the
		// first decoding has replaced any invalid UTF-8 (encoding/json
		// writes what it replaced as \ufffd, and U+FFFD itself raw).
		again, jerr := json.Marshal(rec)
		if jerr != nil {
			t.Fatalf("json.Marshal(record) error: %v", jerr)
		}
		if d := cmp.Diff(jsonValue(t, enc), jsonValue(t, again)); d != "" {
			t.Errorf("re-encoded record differs (-first +second):\n%s", d)
		}
		var rec2 deadLetter
		if jerr := json.Unmarshal(again, &rec2); jerr != nil {
			t.Fatalf("json.Unmarshal(%s) error: %v", again, jerr)
		}
		third, jerr := json.Marshal(rec2)
		if jerr != nil {
			t.Fatalf("json.Marshal(record) error: %v", jerr)
		}
		if string(third) != string(again) {
			t.Errorf("record does not re-encode stably:\nsecond %s\nthird  %s", again, third)
		}
	})
}

// wantAdvice is the documented ItemRetryable of each error type: false
// for a Truncated, and for an Exhausted whose attempts were all rejected
// or truncated; true otherwise.
func wantAdvice(outcome string, attempts []llmretry.Attempt) bool {
	switch outcome {
	case "truncated":
		return false
	case "exhausted":
		// "False when the chain stopped on a provider's refusal of the
		// content, or ... every one was rejected, truncated or refused."
		if n := len(attempts); n > 0 && attempts[n-1].Why == llmretry.WhyRefused {
			return false
		}
		for _, a := range attempts {
			if a.Kind != llmretry.KindRejected && a.Kind != llmretry.KindTruncated && a.Kind != llmretry.KindRefused {
				return true
			}
		}
		return len(attempts) == 0
	}
	return true
}

// jsonValue decodes a JSON text generically, numbers kept as written.
func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	return v
}

// allFailed reports whether every attempt is a failure's record, one that
// keeps its Kind in JSON.
func allFailed(attempts []llmretry.Attempt) bool {
	for _, a := range attempts {
		if a.Err == nil && a.Next == "" {
			return false
		}
	}
	return true
}

// fuzzTimeout is a net.Error from some library that reports a timeout
// (or not) without wrapping anything.
type fuzzTimeout struct{ timeout bool }

func (e fuzzTimeout) Error() string   { return fmt.Sprintf("i/o timeout=%v", e.timeout) }
func (e fuzzTimeout) Timeout() bool   { return e.timeout }
func (e fuzzTimeout) Temporary() bool { return false }

// errModel is what Classify's documentation says decides an error's Kind:
// the outermost typed error of the package (found as errors.As finds it),
// else the rules for other errors, some of which look anywhere in the
// tree and some at the first match only.
type errModel struct {
	typed     bool
	typedKind llmretry.Kind
	canceled  bool          // context.Canceled anywhere
	timeout   bool          // context.DeadlineExceeded or a timing-out net.Error anywhere
	errno     syscall.Errno // the first Errno, as errors.As finds it; 0 for none
	eof       bool          // io.EOF or io.ErrUnexpectedEOF anywhere
	op        string        // the Op of the first *net.OpError; "" for none
}

func (m errModel) kind() llmretry.Kind {
	switch {
	case m.typed:
		return m.typedKind
	case m.canceled:
		return llmretry.KindCancelled
	case m.timeout:
		return llmretry.KindTimeout
	}
	switch m.errno {
	case syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE:
		return llmretry.KindTransient
	}
	if m.eof || m.op == "dial" {
		return llmretry.KindTransient
	}
	return llmretry.KindUnknown
}

// join is the model of errors.Join(a, b): the first-match rules take a's
// match when it has one.
func (m errModel) join(b errModel) errModel {
	j := m
	if !m.typed {
		j.typed, j.typedKind = b.typed, b.typedKind
	}
	j.canceled = m.canceled || b.canceled
	j.timeout = m.timeout || b.timeout
	if m.errno == 0 {
		j.errno = b.errno
	}
	j.eof = m.eof || b.eof
	if m.op == "" {
		j.op = b.op
	}
	return j
}

// typedAs is the model of an error whose outermost typed error is ours.
func typedAs(k llmretry.Kind) errModel { return errModel{typed: true, typedKind: k} }

// statusKind is ClassifyStatus's rule as documented.
func statusKind(code int) llmretry.Kind {
	switch {
	case code == 408 || code == 425 || code == 429 || (code >= 500 && code <= 599):
		return llmretry.KindTransient
	case code >= 400 && code <= 499:
		return llmretry.KindRejected
	}
	return llmretry.KindUnknown
}

// fuzzLeaf builds an error that wraps nothing of interest, with its model.
func fuzzLeaf(r *fuzzBytes) (errModel, error) {
	switch r.pick(22) {
	case 0:
		return errModel{canceled: true}, context.Canceled
	case 1:
		return errModel{timeout: true}, context.DeadlineExceeded
	case 2:
		return errModel{timeout: true}, llmretry.ErrAttemptTimeout
	case 3:
		return errModel{timeout: true}, llmretry.ErrStalled
	case 4:
		return errModel{eof: true}, io.EOF
	case 5:
		return errModel{eof: true}, io.ErrUnexpectedEOF
	case 6:
		errnos := []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.ENOENT, syscall.EINVAL}
		e := errnos[r.pick(len(errnos))]
		return errModel{errno: e}, e
	case 7:
		// ETIMEDOUT's Timeout() is true: an Errno and a timeout at once.
		return errModel{errno: syscall.ETIMEDOUT, timeout: true}, syscall.ETIMEDOUT
	case 8:
		return errModel{op: "dial"}, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route")}
	case 9:
		return errModel{op: "dial", errno: syscall.ECONNREFUSED}, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case 10:
		return errModel{timeout: true}, fuzzTimeout{true}
	case 11:
		return errModel{}, fuzzTimeout{false}
	case 12:
		t := r.pick(2) == 1
		return errModel{timeout: t}, &net.DNSError{Err: "lookup", Name: "api.example", IsTimeout: t}
	case 13:
		k := llmretry.Kind(r.pick(9))
		return typedAs(k), &llmretry.Failure{Kind: k, Err: context.Canceled}
	case 14:
		var nilFailure *llmretry.Failure
		return typedAs(llmretry.KindUnknown), nilFailure
	case 15:
		code := fuzzStatuses[r.pick(len(fuzzStatuses))]
		return typedAs(statusKind(code)), llmretry.StatusFailure(code, nil, io.EOF)
	case 16:
		attempts := fuzzAttempts(r, "a|b")
		want := llmretry.KindUnknown
		if n := len(attempts); n > 0 {
			want = attempts[n-1].Kind
		}
		return typedAs(want), &llmretry.Exhausted{Attempts: attempts}
	case 17:
		return typedAs(llmretry.KindTruncated), &llmretry.Truncated{}
	case 18:
		return typedAs(llmretry.KindTimeout), &llmretry.TimedOut{Cause: context.Canceled}
	case 19:
		return typedAs(llmretry.KindCancelled), &llmretry.Cancelled{Cause: context.DeadlineExceeded}
	case 20:
		return typedAs(llmretry.KindTruncated), llmretry.Truncation("partial")
	}
	return errModel{}, errors.New("something else")
}

// FuzzClassify builds errors by nesting leaves of every sort (context
// errors, errnos, net errors, our Failures and chain errors) under
// layers of %w, errors.Join, *url.Error, *net.OpError, *os.SyscallError
// and our own types, and checks Classify at every layer against the
// documented rules. A layer that is not ours and adds nothing of its own
// (%w, url.Error, a Join with plain errors, a SyscallError) must leave the
// Kind as it was.
func FuzzClassify(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{8, 2, 1, 3})
	f.Add([]byte{9, 4, 0})
	f.Add([]byte{6, 4, 9, 6, 1})
	f.Add([]byte{14, 0, 1, 2, 3})
	f.Add([]byte{16, 3, 1, 0, 4, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{10, 2, 11, 10, 12, 10, 13, 1})
	f.Add([]byte{4})
	f.Add([]byte{10, 5})
	f.Add([]byte{7, 3})
	f.Add([]byte{11, 9, 10})
	f.Add([]byte{21, 7})
	f.Add([]byte{5, 10, 7, 11, 0, 12, 9, 1})
	f.Fuzz(func(t *testing.T, choices []byte) {
		r := fuzzBytes(choices)
		m, err := fuzzLeaf(&r)
		check := func(layer string) {
			t.Helper()
			if got, want := llmretry.Classify(err), m.kind(); got != want {
				t.Fatalf("after %s: Classify(%v) = %v, want %v", layer, err, got, want)
			}
		}
		check("the leaf")
		for layer := 0; layer < 16 && len(r) > 0; layer++ {
			before := llmretry.Classify(err)
			transparent := true
			var name string
			switch r.pick(14) {
			case 0:
				name, err = "%w", fmt.Errorf("call: %w", err)
			case 1:
				name, err = "url.Error", &url.Error{Op: "Post", URL: "https://api.example/v1", Err: err}
			case 2:
				name, err = "Join(e)", errors.Join(err)
			case 3:
				name, err = "Join(plain, e)", errors.Join(errors.New("plain"), err)
			case 4:
				name, err = "Join(e, plain)", errors.Join(err, errors.New("plain"))
			case 5:
				name, err = "%w and %w", fmt.Errorf("%w; %w", errors.New("plain"), err)
			case 6:
				name, err = "SyscallError", &os.SyscallError{Syscall: "read", Err: err}
			case 7:
				// Not transparent: errors.As finds this OpError before any
				// dial error beneath it.
				name, err, transparent = "OpError read", &net.OpError{Op: "read", Net: "tcp", Err: err}, false
				m.op = "read"
			case 8:
				om, other := fuzzLeaf(&r)
				name, err, transparent = "Join(e, leaf)", errors.Join(err, other), false
				m = m.join(om)
			case 9:
				om, other := fuzzLeaf(&r)
				name, err, transparent = "Join(leaf, e)", errors.Join(other, err), false
				m = om.join(m)
			case 10:
				k := llmretry.Kind(r.pick(9))
				name, err, transparent = "Failure", &llmretry.Failure{Kind: k, Err: err}, false
				m = typedAs(k)
			case 11:
				name, err, transparent = "Cancelled", &llmretry.Cancelled{Cause: err}, false
				m = typedAs(llmretry.KindCancelled)
			case 12:
				name, err, transparent = "TimedOut", &llmretry.TimedOut{Cause: err}, false
				m = typedAs(llmretry.KindTimeout)
			case 13:
				k := llmretry.Kind(r.pick(9))
				attempts := []llmretry.Attempt{{Kind: llmretry.KindRejected, Err: errors.New("first")}, {Kind: k, Err: err}}
				// Exhaust makes a Truncated when k is truncated, a TimedOut
				// when it is a timeout, else an Exhausted: in each case
				// the Kind is k, whatever the attempt's error says.
				name, err, transparent = "Exhausted", &llmretry.Exhausted{Attempts: attempts}, false
				if r.pick(2) == 1 {
					name, err = "Exhaust", llmretry.Exhaust(attempts)
				}
				m = typedAs(k)
			}
			check(name)
			if got := llmretry.Classify(err); transparent && got != before {
				t.Fatalf("wrapping in %s changed Classify from %v to %v: %v", name, before, got, err)
			}
		}
	})
}

// statusSecret is planted in the request URL that the backend's error
// names, as net/http names it; nothing the chain prints may carry it.
const statusSecret = "sk-proj-Fuzz0Secret1Planted2InTheURL3"

// FuzzStatusFailure follows an HTTP error response of any status and any
// header values (several per key, as proxies send them) from
// StatusFailure through a Chain, in virtual time: the record keeps the
// Failure's Kind, status and hint; the chain retries after the longer of
// its wait and the hint, ends the backend's retries on a hint past
// MaxWait, fails over at once on a Kind it does not retry; and no record,
// error text or JSON carries the key planted in the URL.
func FuzzStatusFailure(f *testing.F) {
	f.Add(429, "", "1e18", "", "", "rate limited")
	f.Add(503, "", "-1", "5", "", "busy")
	f.Add(429, "NaN", "NaN", "", "", "")
	f.Add(503, "", "Thu, 01 Jan 1970 00:00:00 GMT", "", "", "")
	f.Add(503, "", "Fri, 31 Dec 9999 23:59:59 GMT", "", "", "")
	f.Add(529, "250", "", "", "true", `{"type":"error","error":{"type":"overloaded_error"}}`)
	f.Add(500, "", "300", "301", "false", "internal")
	f.Add(429, "300001", "", "", "", "just past the default MaxWait")
	f.Add(400, "", "7", "", "TRUE", "context_length_exceeded")
	f.Add(200, "", "", "", "", "ok?")
	f.Add(-1, "", "\u00a012", "", "ｔｒｕｅ", "\xff\xfe")
	f.Fuzz(func(t *testing.T, code int, ms, ra, ra2, should, body string) {
		h := http.Header{}
		add := func(key, v string) {
			if v != "" {
				h.Add(key, v)
			}
		}
		add("Retry-After-Ms", ms)
		add("Retry-After", ra)
		add("Retry-After", ra2) // a second value: Header.Get reads the first
		add("X-Should-Retry", should)
		cause := errors.New(`Post "https://user:` + statusSecret + `@api.example/v1/chat?api_key=` + statusSecret + `": ` + body)

		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var fl *llmretry.Failure
			calls := 0
			const wait = 2 * time.Second
			c := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
				Model: "m",
				Call: func(ctx context.Context, req string) (string, error) {
					calls++
					if calls == 1 {
						fl = llmretry.StatusFailure(code, h, cause)
						return "", fl
					}
					return "answer", nil
				},
				Retry: llmretry.Policy{Waits: []time.Duration{wait}},
			}}}
			var seen []llmretry.Attempt
			c.OnAttempt = func(_ context.Context, a llmretry.Attempt) { seen = append(seen, a) }
			resp, err := c.Do(context.Background(), "q")

			first := seen[0]
			if first.Kind != fl.Kind || first.Status != code || first.RetryAfter != fl.RetryAfter {
				t.Fatalf("record of %d %q = kind %v, status %d, retry_after %v; want the Failure's %v, %d, %v",
					code, h, first.Kind, first.Status, first.RetryAfter, fl.Kind, code, fl.RetryAfter)
			}
			if fl.RetryAfter < 0 {
				t.Fatalf("StatusFailure(%d, %q).RetryAfter = %v, want never negative", code, h, fl.RetryAfter)
			}
			retried := fl.Kind == llmretry.KindTransient || fl.Kind == llmretry.KindTimeout || fl.Kind == llmretry.KindParse
			switch {
			case retried && fl.RetryAfter > llmretry.DefaultMaxWait:
				if first.Next != llmretry.NextStop || first.Why != llmretry.WhyMaxWait || err == nil {
					t.Fatalf("hint %v past MaxWait: record says %v/%v, Do err %v; want stop/max_wait and an error", fl.RetryAfter, first.Next, first.Why, err)
				}
			case retried:
				in := max(wait, fl.RetryAfter)
				if first.Next != llmretry.NextRetry || first.RetryIn != in {
					t.Fatalf("hint %v: record says %v in %v, want retry in %v", fl.RetryAfter, first.Next, first.RetryIn, in)
				}
				if resp != "answer" || err != nil || time.Since(start) != in {
					t.Fatalf("Do() = %q, %v after %v; want the answer after %v", resp, err, time.Since(start), in)
				}
			default:
				if first.Next != llmretry.NextStop || first.Why != llmretry.WhyNotRetryable || err == nil {
					t.Fatalf("kind %v: record says %v/%v, Do err %v; want stop/not_retryable and an error", fl.Kind, first.Next, first.Why, err)
				}
				if got, want := llmretry.RetryItem(err), fl.Kind != llmretry.KindRejected; got != want {
					t.Fatalf("RetryItem after one %v attempt = %v, want %v", fl.Kind, got, want)
				}
			}

			var printed []string
			for _, a := range seen {
				data, jerr := json.Marshal(a)
				if jerr != nil {
					t.Fatalf("json.Marshal(record) = %v", jerr)
				}
				printed = append(printed, a.String(), string(data))
			}
			if err != nil {
				data, jerr := json.Marshal(err)
				if jerr != nil {
					t.Fatalf("json.Marshal(error) = %v", jerr)
				}
				printed = append(printed, err.Error(), string(data))
			}
			printed = append(printed, fl.Error())
			for _, p := range printed {
				if strings.Contains(p, statusSecret) {
					t.Fatalf("the planted key survives in %q", p)
				}
			}
		})
	})
}
