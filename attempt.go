package llmretry

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// Attempt is the record of one request to one backend. The chain's errors
// carry one per failed attempt, in order, and [Chain.OnAttempt] sees every
// attempt as it ends. Attempts encode to JSON (snake_case keys, durations
// as *_ms numbers) for job queues and dead-letter tables, and log as slog
// groups without the model's output.
type Attempt struct {
	Backend    int           // 0-based position in the chain
	Model      string        // the backend's Model, or "unknown"
	Try        int           // 1 for the first request to this backend, 2 for its first retry, ...; a skip has the Try its request would have had, and a backend come back to goes on counting
	Kind       Kind          // how it failed; the zero Kind for a success
	Status     int           // HTTP status when known
	Err        error         // the backend's error as it returned it; nil for a success
	RawText    *string       // absent (nil) when there was no body worth keeping; present, even "", otherwise
	Start      time.Time     // when the request was sent
	Elapsed    time.Duration // how long the backend's Call took
	RetryAfter time.Duration // the server's retry-after hint, 0 if none; kept even when too long to honour
	Next       Next          // what the chain did next; empty for a success
	Why        Why           // why the backend was not retried; empty when Next is NextRetry, and for a success
	RetryIn    time.Duration // the wait before the retry when Next is NextRetry (0: at once); otherwise 0
	Delivered  bool          // the attempt had already delivered output to the caller (see Delivered)
	// Skipped says no request was sent: the backend's Breaker was open.
	// Kind is then the Kind of the failure that opened it, Why is
	// "breaker" (or what ended the wait for it), Elapsed is zero, and
	// RetryAfter is the time until the breaker half-opened. A call that
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
	WhyNested       Why = "nested"        // the chain runs inside another chain's retrying attempt, so it makes one attempt per backend
	WhyBreaker      Why = "breaker"       // the backend's Breaker was open, or would be when a retry's wait ended: skipped, not waited for because it would not half-open within the bound Backend.Breaker states, or waited for in vain
)

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
		b.WriteString("skipped: breaker open after " + a.Kind.String() + " failures")
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
	return slog.GroupValue(attrs...)
}

// failed reports whether the attempt is a failure's record: a success has
// no error and nothing after it.
func (a *Attempt) failed() bool { return a.Err != nil || a.Next != "" }

// millis converts d to milliseconds for logs.
func millis(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// attemptJSON is the wire form of an Attempt.
type attemptJSON struct {
	Backend      int       `json:"backend"`
	Model        string    `json:"model"`
	Try          int       `json:"try"`
	Kind         *Kind     `json:"kind,omitempty"` // absent for a success
	Status       int       `json:"status"`
	Error        *string   `json:"error,omitempty"`
	RawText      *string   `json:"raw_text,omitempty"` // a pointer, so "" is kept and nil is left out
	Start        time.Time `json:"start"`
	ElapsedMS    msec      `json:"elapsed_ms"`
	RetryAfterMS msec      `json:"retry_after_ms,omitempty"`
	Next         Next      `json:"next,omitempty"`
	Why          Why       `json:"why,omitempty"`
	RetryInMS    msec      `json:"retry_in_ms"`
	Delivered    bool      `json:"delivered"`
	Skipped      bool      `json:"skipped,omitempty"`
}

// MarshalJSON encodes the attempt with snake_case keys: the error as its
// redacted message, raw_text left out when RawText is nil and kept when it
// is "", durations as exact milliseconds (elapsed_ms, retry_after_ms when
// there was a hint, retry_in_ms), next and why as their names, the kind as
// its name, and "skipped": true for an attempt a breaker skipped; a
// success has no kind, error, next or why.
func (a Attempt) MarshalJSON() ([]byte, error) {
	j := attemptJSON{
		Backend:      a.Backend,
		Model:        a.Model,
		Try:          a.Try,
		Status:       a.Status,
		RawText:      a.RawText,
		Start:        a.Start,
		ElapsedMS:    msec(a.Elapsed),
		RetryAfterMS: msec(a.RetryAfter),
		Next:         a.Next,
		Why:          a.Why,
		RetryInMS:    msec(a.RetryIn),
		Delivered:    a.Delivered,
		Skipped:      a.Skipped,
	}
	if a.failed() {
		j.Kind = &a.Kind
	}
	if a.Err != nil {
		msg := Redact(a.Err.Error())
		j.Error = &msg
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote. The error comes back as a
// plain error with the same message: its type does not survive, but Kind,
// Status and RawText keep what the chain concluded from it.
func (a *Attempt) UnmarshalJSON(data []byte) error {
	var j attemptJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("llmretry: decoding attempt: %w", err)
	}
	*a = Attempt{
		Backend:    j.Backend,
		Model:      j.Model,
		Try:        j.Try,
		Status:     j.Status,
		RawText:    j.RawText,
		Start:      j.Start,
		Elapsed:    time.Duration(j.ElapsedMS),
		RetryAfter: time.Duration(j.RetryAfterMS),
		Next:       j.Next,
		Why:        j.Why,
		RetryIn:    time.Duration(j.RetryInMS),
		Delivered:  j.Delivered,
		Skipped:    j.Skipped,
	}
	if j.Kind != nil {
		a.Kind = *j.Kind
	}
	if j.Error != nil {
		a.Err = errors.New(*j.Error)
	}
	return nil
}

// msec is a Duration that encodes as a JSON number of milliseconds,
// written and read exactly, so that every Duration round-trips: a float64
// cannot hold the nanoseconds of the longest waits.
type msec time.Duration

// MarshalJSON writes the milliseconds as a decimal with up to six
// fraction digits.
func (m msec) MarshalJSON() ([]byte, error) {
	ns := int64(m)
	neg := ns < 0
	abs := uint64(ns)
	if neg {
		abs = -abs
	}
	s := strconv.FormatUint(abs/1e6, 10)
	if frac := abs % 1e6; frac != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%06d", frac), "0")
	}
	if neg {
		s = "-" + s
	}
	return []byte(s), nil
}

// UnmarshalJSON reads any JSON number of milliseconds, rounding to the
// nanosecond, and refuses a negative one (no record holds one) or one
// that a Duration cannot hold.
func (m *msec) UnmarshalJSON(data []byte) error {
	s := string(data)
	if s == "null" {
		return nil
	}
	if strings.ContainsAny(s, "eE") {
		// Not what MarshalJSON writes; read it as a float, so that a huge
		// exponent costs no huge number.
		f, err := strconv.ParseFloat(s, 64)
		ns := math.Round(f * float64(time.Millisecond))
		if err != nil || math.IsNaN(ns) || ns < 0 || ns >= math.MaxInt64 {
			return fmt.Errorf("llmretry: decoding attempt: %s milliseconds is out of range", data)
		}
		*m = msec(ns)
		return nil
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return fmt.Errorf("llmretry: decoding attempt: %s is not a number of milliseconds", data)
	}
	ns := new(big.Rat).Mul(r, big.NewRat(int64(time.Millisecond), 1))
	// Round half away from zero to the nearest nanosecond.
	q, rem := new(big.Int).QuoRem(ns.Num(), ns.Denom(), new(big.Int))
	if new(big.Int).Mul(new(big.Int).Abs(rem), big.NewInt(2)).Cmp(ns.Denom()) >= 0 {
		q.Add(q, big.NewInt(int64(rem.Sign())))
	}
	if !q.IsInt64() || q.Sign() < 0 {
		return fmt.Errorf("llmretry: decoding attempt: %s milliseconds is out of range", data)
	}
	*m = msec(q.Int64())
	return nil
}
