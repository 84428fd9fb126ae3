package llmretry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmretry/llmretry/internal/jsontype"
)

// Attempt is the record of one request to one backend. The chain's errors
// carry one per failed attempt, in order, and [Chain.OnAttempt] sees every
// attempt as it ends. Attempts encode to JSON (snake_case keys, durations
// as *_ms numbers) for job queues and dead-letter tables, and log as slog
// groups without the model's output. Every rendering (String, JSON, slog)
// passes the error and the raw output through [Redact].
type Attempt struct {
	Backend    int           // 0-based position in the chain
	Model      string        // the backend's Model, or "unknown"
	Try        int           // 1 for the first request to this backend, 2 for its first retry, ...; a skip has the Try its request would have had, and a backend come back to goes on counting
	Kind       Kind          // how it failed; the zero Kind for a success
	Status     int           // HTTP status when known
	Err        error         // the backend's error as it returned it; nil for a success
	RawText    *string       // absent (nil) when there was no body worth keeping; present, even "", otherwise; kept whole here, redacted wherever the record is rendered
	Start      time.Time     // when the request was sent
	Elapsed    time.Duration // how long the backend's Call took; for a skip, how long the call waited for the breaker in vain
	RetryAfter time.Duration // the server's retry-after hint, 0 if none; kept even when too long to honour
	Next       Next          // what the chain did next; empty for a success
	Why        Why           // why the backend was not retried; empty when Next is NextRetry (but for a wait for pacing, Why paced), and for a success
	RetryIn    time.Duration // the wait before the retry when Next is NextRetry (0: at once); otherwise 0
	Delivered  bool          // the attempt had already delivered output to the caller (see Delivered)
	Usage      *Usage        // what the provider reported the attempt cost (see ReportUsage); zero when the request never reached the provider (a refused connection, a failed dial or DNS lookup); nil when it reported nothing, which is unknown, not zero
	Deployment string        // for a backend that is a pool, the deployment the request went to (or whose breaker held it back); empty otherwise
	Chosen     Chosen        // for a backend that is a pool, why that deployment was chosen (see Chosen), on every record of its requests, skips and waits; empty otherwise
	// ContinuedFrom is how many bytes of the answer the caller already
	// held when the attempt was sent, which it was asked to continue
	// (Chain.Continue, Continuing); 0 for an attempt that began the
	// answer. RawText is then the attempt's own output, what followed.
	ContinuedFrom int
	// Restarted says the attempt began the answer again: the call's
	// stream was told to discard what it held (Chain.Restart).
	Restarted bool
	// Skipped says no request was sent: the backend's Breaker was open,
	// or held the request back by the provider's rate-limit reports (Why
	// "paced", Kind transient). Kind is otherwise the Kind of the failure
	// that opened it, Why is "breaker" (or what ended the wait for it),
	// and RetryAfter is the time from Start+Elapsed until the breaker
	// half-opened, or until the provider admits the next request. A call that
	// waited for the breaker in vain has Start when the wait began and
	// Elapsed its length (otherwise Elapsed is zero). A call that
	// waited for the breaker and was then let through has a skip with
	// Next retry, written when the wait ended: Start is when the wait
	// began and RetryIn how long it lasted; the request sent next has
	// the same Try.
	Skipped bool
}

// Next is what a chain did after a failed attempt.
type Next string

const (
	NextRetry    Next = "retry"     // sent the request to the same backend again, after RetryIn
	NextFailOver Next = "fail_over" // went on to the next backend
	NextStop     Next = "stop"      // Do returned
)

// Why is why a chain did not retry a backend after a failed attempt.
type Why string

const (
	WhyNotRetryable Why = "not_retryable" // the attempt's Kind is not retried
	WhyWaitsUsed    Why = "waits_used"    // the policy allows no further try: no waits, the list ran out without a deadline, a zero last wait, or Policy.MaxTries reached
	WhyReserve      Why = "reserve"       // the next wait would end at or past the deadline, or leave less than the reserve
	WhyMaxWait      Why = "max_wait"      // the server's retry-after was longer than Policy.MaxWait
	WhyDelivered    Why = "delivered"     // output had reached the caller: nothing may be resent
	WhyDeadline     Why = "deadline"      // the caller's deadline passed
	WhyCancelled    Why = "cancelled"     // the caller withdrew, or the backend said it had
	WhyNested       Why = "nested"        // the chain runs under another chain's attempt that may be retried (its backend has Waits, or its chain is nested so; see Chain.Do), so it makes one attempt per backend
	WhyBreaker      Why = "breaker"       // the backend's Breaker was open, or would be when a retry's wait ended: skipped, not waited for because it would not half-open within the bound Backend.Breaker states, or waited for in vain
	WhyPaced        Why = "paced"         // the backend's Breaker held the request back by the provider's rate-limit reports, without a failure: skipped, waited for in vain or past the bound (see Breaker), or waited for and then sent (Next retry)
	WhyRefused      Why = "refused"       // the provider refused the content (KindRefused): the chain stopped rather than send it to another backend (see Chain.FailOverRefused)
	WhySilent       Why = "silent"        // the attempt timed out before any output and Policy.FailOverSilent is set: failed over at once rather than retried
)

// WhyCannotContinue is why a call whose caller holds part of the answer
// (Chain.Continue) failed over from a backend, or passed it over: the
// backend cannot continue the answer (Backend.CanContinue), or refused to
// (ErrCannotContinue).
const WhyCannotContinue Why = "cannot_continue"

// String returns the attempt as one line, "[backend 0 gpt-4o try 1] http
// 500: upstream on fire (retrying in 30ms)": where it ran, the first line
// of the error's message (secrets redacted), and what followed, or "ok"
// for a success.
func (a Attempt) String() string {
	var b strings.Builder
	b.WriteString("[backend ")
	b.WriteString(strconv.Itoa(a.Backend))
	b.WriteByte(' ')
	b.WriteString(a.Model)
	b.WriteString(" try ")
	b.WriteString(strconv.Itoa(a.Try))
	b.WriteString("] ")
	if a.Err == nil && a.Next == "" {
		b.WriteString("ok")
		return b.String()
	}
	switch {
	case a.Skipped:
		if a.Why == WhyPaced {
			b.WriteString("skipped: paced by the provider's rate limits")
		} else {
			b.WriteString("skipped: breaker open after " + a.Kind.String() + " failures")
		}
	case a.Err != nil:
		b.WriteString(Redact(firstLine(a.Err.Error())))
	default:
		b.WriteString(a.Kind.String())
	}
	switch a.Next {
	case NextRetry:
		if a.RetryIn == 0 {
			b.WriteString(" (retrying at once)")
		} else {
			b.WriteString(" (retrying in " + a.RetryIn.String() + ")")
		}
	case NextFailOver:
		b.WriteString(" (failing over: " + string(a.Why) + ")")
	case NextStop:
		b.WriteString(" (stopping: " + string(a.Why) + ")")
	}
	return b.String()
}

// LogValue returns the attempt as a slog group, durations in milliseconds
// as in its JSON. It leaves out the model's raw output, which may hold
// user data, and gives only its length.
func (a Attempt) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 14)
	attrs = append(attrs,
		slog.Int("backend", a.Backend),
		slog.String("model", a.Model),
		slog.Int("try", a.Try),
	)
	if a.failed() {
		attrs = append(attrs, slog.String("kind", a.Kind.String()))
	}
	if a.Status != 0 {
		attrs = append(attrs, slog.Int("status", a.Status))
	}
	if a.Err != nil {
		attrs = append(attrs, slog.String("error", Redact(a.Err.Error())))
	}
	if a.RawText != nil {
		attrs = append(attrs, slog.Int("raw_len", len(*a.RawText)))
	}
	attrs = append(attrs, slog.Float64("elapsed_ms", millis(a.Elapsed)))
	if a.RetryAfter != 0 {
		attrs = append(attrs, slog.Float64("retry_after_ms", millis(a.RetryAfter)))
	}
	if a.Next != "" {
		attrs = append(attrs, slog.String("next", string(a.Next)))
	}
	if a.Next == NextRetry {
		attrs = append(attrs, slog.Float64("retry_in_ms", millis(a.RetryIn)))
	}
	if a.Why != "" {
		attrs = append(attrs, slog.String("why", string(a.Why)))
	}
	if a.Delivered {
		attrs = append(attrs, slog.Bool("delivered", true))
	}
	if a.Skipped {
		attrs = append(attrs, slog.Bool("skipped", true))
	}
	if a.ContinuedFrom != 0 {
		attrs = append(attrs, slog.Int("continued_from", a.ContinuedFrom))
	}
	if a.Restarted {
		attrs = append(attrs, slog.Bool("restarted", true))
	}
	if u := a.Usage; u != nil {
		attrs = append(attrs, slog.Group("usage", usageAttrs(*u)...))
	}
	return slog.GroupValue(attrs...)
}

// usageAttrs is u as slog attributes, with the keys of its JSON.
func usageAttrs(u Usage) []any {
	attrs := []any{slog.Int64("input_tokens", u.InputTokens), slog.Int64("output_tokens", u.OutputTokens)}
	if u.CachedInputTokens != 0 {
		attrs = append(attrs, slog.Int64("cached_input_tokens", u.CachedInputTokens))
	}
	if u.ReasoningTokens != 0 {
		attrs = append(attrs, slog.Int64("reasoning_tokens", u.ReasoningTokens))
	}
	return attrs
}

// failed reports whether the attempt is a failure's record: a success has
// no error and nothing after it.
func (a *Attempt) failed() bool { return a.Err != nil || a.Next != "" }

// millis converts d to milliseconds for logs.
func millis(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// MarshalJSON encodes the attempt as a JSON object with snake_case keys,
// in this order:
//
//   - backend, model, try: always;
//   - kind: the Kind's name, for a failure's record (an error, a Next or a
//     non-zero Kind); absent for a success;
//   - status: for a failure's record always, 0 included (the columns of a
//     dead-letter table stay the same from record to record); for a
//     success only when it is not 0;
//   - error: the error's redacted message, when there is an error;
//   - raw_text: the model's output, its secrets redacted ([Redact]) as
//     the error's are; absent when RawText is nil, kept when it is "";
//   - start: RFC 3339 with nanoseconds, in the time's own offset, or in
//     UTC when RFC 3339 cannot write that offset (seconds, or a day or
//     more);
//   - elapsed_ms, retry_after_ms (only when not 0), retry_in_ms:
//     durations as exact decimal milliseconds, up to six fraction digits,
//     negative ones included;
//   - next, why: their names, when set;
//   - delivered: always; skipped: only when true;
//   - continued_from: only when not 0; restarted: only when true;
//   - usage: an object of input_tokens and output_tokens, with
//     cached_input_tokens and reasoning_tokens when not 0 (as [Usage]
//     encodes), only when Usage is not nil.
//
// It fails only for a start whose year, where it is written, lies outside
// 0 to 9999, which RFC 3339 cannot write and so [Attempt.UnmarshalJSON]
// could not read.
func (a Attempt) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 256)
	b = append(b, '{')
	first := true
	for i := range attemptFields {
		f := &attemptFields[i]
		if f.omit != nil && f.omit(&a) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendQuote(b, f.key) // keys are plain ASCII: quoted as JSON quotes them
		b = append(b, ':')
		var err error
		if b, err = f.write(b, &a); err != nil {
			return nil, fmt.Errorf("llmretry: encoding attempt: field %q: %s", f.key, err)
		}
	}
	return append(b, '}'), nil
}

// UnmarshalJSON decodes what [Attempt.MarshalJSON] wrote, every field as
// it was: Kind, Status, RawText (nil or not, with the redacted text that
// was written), every Duration to the nanosecond, negative ones included,
// and Start's instant and offset. The
// error comes back as a plain error with the message that was written:
// its type does not survive, but Kind, Status and RawText keep what the
// chain concluded from it. Strings come back as JSON holds them, so a
// byte that was not UTF-8 is U+FFFD.
//
// It reads more than MarshalJSON writes, and refuses nothing that
// MarshalJSON writes: a key absent or null is the field's zero value, an
// unknown key is ignored (a newer writer's field), milliseconds may carry
// more than six fraction digits (rounded half away from zero to the
// nanosecond) or an exponent (read as a float64, so not exactly), and
// start may be in any offset. It refuses a value of the wrong JSON type, a
// number out of its field's range or an integer field with a fraction, an
// unknown kind, and a start that is not RFC 3339: nothing MarshalJSON
// writes, and nothing it could not write back. Its
// errors begin "llmretry: decoding attempt: " and name the field, and a
// failed decoding leaves a unchanged. JSON null leaves a unchanged too, as
// encoding/json does.
func (a *Attempt) UnmarshalJSON(data []byte) error {
	if jsontype.IsNull(data) {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fmt.Errorf("llmretry: decoding attempt: want an object, got %s", jsontype.Of(data))
		}
		return fmt.Errorf("llmretry: decoding attempt: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	var got Attempt
	for i := range attemptFields {
		f := &attemptFields[i]
		v, ok := raw[f.key]
		if !ok || jsontype.IsNull(v) {
			continue
		}
		if err := f.read(&got, v); err != nil {
			return fmt.Errorf("llmretry: decoding attempt: field %q: %s", f.key, err)
		}
	}
	*a = got
	return nil
}

// attemptField is one key of an Attempt's JSON. write appends the value;
// read parses one that is neither absent nor null, and reverses write
// exactly; omit, when set, says when the key is left out, which reads back
// as the field's zero value. A new field of Attempt is a new row in
// attemptFields, at the place its key is to be written.
type attemptField struct {
	key   string
	omit  func(a *Attempt) bool
	write func(b []byte, a *Attempt) ([]byte, error)
	read  func(a *Attempt, v []byte) error
}

// attemptFields is the wire form of an Attempt, key by key, in order.
var attemptFields = [...]attemptField{
	intField("backend", nil, func(a *Attempt) *int { return &a.Backend }),
	stringField("model", nil, func(a *Attempt) *string { return &a.Model }),
	intField("try", nil, func(a *Attempt) *int { return &a.Try }),
	{
		key:  "kind",
		omit: func(a *Attempt) bool { return !a.failure() },
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return strconv.AppendQuote(b, a.Kind.String()), nil // a Kind's name is plain ASCII
		},
		read: func(a *Attempt, v []byte) error {
			s, err := readString(v)
			if err != nil {
				return err
			}
			if a.Kind.UnmarshalText([]byte(s)) != nil {
				return fmt.Errorf("unknown kind %s", shown(v))
			}
			return nil
		},
	},
	intField("status", func(a *Attempt) bool { return !a.failure() && a.Status == 0 }, func(a *Attempt) *int { return &a.Status }),
	{
		key:  "error",
		omit: func(a *Attempt) bool { return a.Err == nil },
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return appendString(b, Redact(a.Err.Error())), nil
		},
		read: func(a *Attempt, v []byte) error {
			s, err := readString(v)
			a.Err = errors.New(s)
			return err
		},
	},
	{
		key:  "raw_text",
		omit: func(a *Attempt) bool { return a.RawText == nil },
		write: func(b []byte, a *Attempt) ([]byte, error) {
			// A model's output may echo a key pasted into the prompt, and
			// the JSON goes to dead-letter tables and logs: redact it as
			// the error is. The field itself stays whole for the caller.
			return appendString(b, Redact(*a.RawText)), nil
		},
		read: func(a *Attempt, v []byte) error {
			s, err := readString(v)
			a.RawText = &s
			return err
		},
	},
	{
		key: "start",
		write: func(b []byte, a *Attempt) ([]byte, error) {
			t := a.Start
			if _, off := t.Zone(); off%60 != 0 || off <= -24*60*60 || off >= 24*60*60 {
				t = t.UTC() // RFC 3339 writes hours and minutes under a day
			}
			if y := t.Year(); y < 0 || y > 9999 {
				return b, errors.New("year outside of range [0,9999]")
			}
			b = t.AppendFormat(append(b, '"'), time.RFC3339Nano) // as time.Time's MarshalJSON writes it
			return append(b, '"'), nil
		},
		read: func(a *Attempt, v []byte) error {
			if jsontype.Of(v) != "string" {
				return fmt.Errorf("want an RFC 3339 time, got %s", jsontype.Of(v))
			}
			// RFC 3339 holds years 0 to 9999 and offsets in minutes under
			// a day: whatever parses, MarshalJSON writes back as it was.
			if err := a.Start.UnmarshalJSON(v); err != nil {
				return fmt.Errorf("want an RFC 3339 time, got %s", shown(v))
			}
			return nil
		},
	},
	durationField("elapsed_ms", nil, func(a *Attempt) *time.Duration { return &a.Elapsed }),
	durationField("retry_after_ms", func(a *Attempt) bool { return a.RetryAfter == 0 }, func(a *Attempt) *time.Duration { return &a.RetryAfter }),
	stringField("next", func(a *Attempt) bool { return a.Next == "" }, func(a *Attempt) *string { return (*string)(&a.Next) }),
	stringField("why", func(a *Attempt) bool { return a.Why == "" }, func(a *Attempt) *string { return (*string)(&a.Why) }),
	durationField("retry_in_ms", nil, func(a *Attempt) *time.Duration { return &a.RetryIn }),
	boolField("delivered", nil, func(a *Attempt) *bool { return &a.Delivered }),
	boolField("skipped", func(a *Attempt) bool { return !a.Skipped }, func(a *Attempt) *bool { return &a.Skipped }),
	stringField("deployment", func(a *Attempt) bool { return a.Deployment == "" }, func(a *Attempt) *string { return &a.Deployment }),
	stringField("chosen", func(a *Attempt) bool { return a.Chosen == "" }, func(a *Attempt) *string { return (*string)(&a.Chosen) }),
	intField("continued_from", func(a *Attempt) bool { return a.ContinuedFrom == 0 }, func(a *Attempt) *int { return &a.ContinuedFrom }),
	boolField("restarted", func(a *Attempt) bool { return !a.Restarted }, func(a *Attempt) *bool { return &a.Restarted }),
	{
		key:  "usage",
		omit: func(a *Attempt) bool { return a.Usage == nil },
		write: func(b []byte, a *Attempt) ([]byte, error) {
			u, err := json.Marshal(a.Usage)
			return append(b, u...), err
		},
		read: func(a *Attempt, v []byte) error {
			if t := jsontype.Of(v); t != "object" {
				return fmt.Errorf("want an object, got %s", t)
			}
			var u Usage
			if err := json.Unmarshal(v, &u); err != nil {
				return fmt.Errorf("want token counts, got %s", shown(v))
			}
			a.Usage = &u
			return nil
		},
	},
}

// failure reports whether the attempt's record is a failure's as its JSON
// tells them apart: it has an error, a Next or a Kind. A record with none
// is a success's, which has no kind in JSON.
func (a *Attempt) failure() bool { return a.failed() || a.Kind != 0 }

// intField is the row of an int field.
func intField(key string, omit func(*Attempt) bool, field func(*Attempt) *int) attemptField {
	return attemptField{
		key:  key,
		omit: omit,
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return strconv.AppendInt(b, int64(*field(a)), 10), nil
		},
		read: func(a *Attempt, v []byte) error {
			if t := jsontype.Of(v); t != "number" {
				return fmt.Errorf("want a number, got %s", t)
			}
			n, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
			switch {
			case errors.Is(err, strconv.ErrRange):
				return fmt.Errorf("%s is out of range", shown(v))
			case err != nil:
				return fmt.Errorf("want an integer, got %s", shown(v))
			}
			*field(a) = int(n)
			return nil
		},
	}
}

// stringField is the row of a string field (Next and Why among them).
func stringField(key string, omit func(*Attempt) bool, field func(*Attempt) *string) attemptField {
	return attemptField{
		key:  key,
		omit: omit,
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return appendString(b, *field(a)), nil
		},
		read: func(a *Attempt, v []byte) error {
			s, err := readString(v)
			*field(a) = s
			return err
		},
	}
}

// boolField is the row of a bool field.
func boolField(key string, omit func(*Attempt) bool, field func(*Attempt) *bool) attemptField {
	return attemptField{
		key:  key,
		omit: omit,
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return strconv.AppendBool(b, *field(a)), nil
		},
		read: func(a *Attempt, v []byte) error {
			if t := jsontype.Of(v); t != "boolean" {
				return fmt.Errorf("want true or false, got %s", t)
			}
			*field(a) = v[0] == 't'
			return nil
		},
	}
}

// durationField is the row of a Duration written as milliseconds.
func durationField(key string, omit func(*Attempt) bool, field func(*Attempt) *time.Duration) attemptField {
	return attemptField{
		key:  key,
		omit: omit,
		write: func(b []byte, a *Attempt) ([]byte, error) {
			return appendMillis(b, *field(a)), nil
		},
		read: func(a *Attempt, v []byte) error {
			if t := jsontype.Of(v); t != "number" {
				return fmt.Errorf("want a number of milliseconds, got %s", t)
			}
			d, ok := parseMillis(string(v))
			if !ok {
				return fmt.Errorf("%s milliseconds is out of range", shown(v))
			}
			*field(a) = d
			return nil
		},
	}
}

// appendString appends s as a JSON string, as encoding/json writes it
// (invalid UTF-8 as U+FFFD, HTML characters escaped).
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

// readString reads a JSON string value.
func readString(v []byte) (string, error) {
	if t := jsontype.Of(v); t != "string" {
		return "", fmt.Errorf("want a string, got %s", t)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("want a string, got %s", shown(v)) // not reached: the object parsed
	}
	return s, nil
}

// shown is a value as an error message quotes it: at most 40 bytes, with
// secrets redacted, since a damaged record may hold anything.
func shown(v []byte) string {
	s := string(v)
	if len(s) > 40 {
		n := 40
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "..."
	}
	return Redact(s)
}

// appendMillis appends d as a decimal number of milliseconds: the whole
// milliseconds, then up to six fraction digits, trailing zeros left out.
// Integer nanoseconds have at most six digits below the millisecond, so
// the decimal is exact.
func appendMillis(b []byte, d time.Duration) []byte {
	abs := uint64(d)
	if d < 0 {
		b = append(b, '-')
		abs = -abs // two's complement: right for math.MinInt64 too
	}
	b = strconv.AppendUint(b, abs/1e6, 10)
	if frac := abs % 1e6; frac != 0 {
		digits := strconv.AppendUint(nil, 1e6+frac, 10)[1:] // six digits, leading zeros kept
		b = append(b, '.')
		b = append(b, bytes.TrimRight(digits, "0")...)
	}
	return b
}

// parseMillis reads a JSON number of milliseconds as a Duration. The
// integer part and six fraction digits are exact; a seventh rounds half
// away from zero, and later ones cannot change that. A number with an
// exponent, which appendMillis never writes, is read as a float64, so
// that a huge exponent costs no huge number. It reports false when the
// Duration cannot hold the number.
func parseMillis(s string) (time.Duration, bool) {
	if strings.ContainsAny(s, "eE") {
		f, err := strconv.ParseFloat(s, 64)
		ns := math.Round(f * float64(time.Millisecond))
		// -2⁶³ and 2⁶³ are exact float64s; a Duration holds [-2⁶³, 2⁶³).
		if err != nil || math.IsNaN(ns) || ns < math.MinInt64 || ns >= math.MaxInt64 {
			return 0, false
		}
		return time.Duration(ns), true
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	limit := uint64(math.MaxInt64) // the largest magnitude, +1 for a negative Duration
	if neg {
		limit++
	}
	ms, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || ms > limit/1e6 {
		return 0, false
	}
	ns := ms * 1e6
	digits := frac + "000000"
	sub, err := strconv.ParseUint(digits[:6], 10, 64)
	if err != nil {
		return 0, false // not reached: JSON numbers have digits here
	}
	if len(frac) > 6 && frac[6] >= '5' {
		sub++ // round half away from zero: what follows is at least half a nanosecond
	}
	if ns > limit-sub {
		return 0, false
	}
	ns += sub
	if neg {
		return time.Duration(-ns), true // two's complement: right for 2⁶³ too
	}
	return time.Duration(ns), true
}
