package llmretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kind says how an attempt failed, and so what the chain does next: try
// the same backend again, fall over to the next one, or stop. The zero
// Kind is [KindUnknown].
type Kind uint8

const (
	// KindUnknown is an error nothing recognised. It is not retried in its
	// backend; the chain falls over to the next one.
	KindUnknown Kind = iota
	// KindTransient is a failure that may pass: HTTP 408, 425, 429 or 5xx,
	// or a refused, reset or aborted connection, or an unexpected EOF.
	KindTransient
	// KindTimeout is an attempt that hit a deadline: the backend's
	// per-attempt Timeout, a net.Error whose Timeout() is true, or
	// context.DeadlineExceeded.
	KindTimeout
	// KindTruncated is a model that stopped at its completion budget
	// (finish_reason "length"). The same request to the same backend would
	// stop at the same place, so it falls over.
	KindTruncated
	// KindParse is a model that answered with output that could not be
	// used. Sampling differs between tries, so it is retried.
	KindParse
	// KindRejected is any other 4xx: this backend would answer the same
	// again, so the chain falls over.
	KindRejected
	// KindCancelled is the caller withdrawing. It ends the chain at once
	// with a [Cancelled].
	KindCancelled
)

var kindNames = [...]string{
	KindUnknown:   "unknown",
	KindTransient: "transient",
	KindTimeout:   "timeout",
	KindTruncated: "truncated",
	KindParse:     "parse",
	KindRejected:  "rejected",
	KindCancelled: "cancelled",
}

// String returns the Kind's lowercase name, such as "transient", or
// "kind(9)" for a value outside the declared constants.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Retryable reports whether a failure of this Kind may be tried again in
// the same backend: true for [KindTransient], [KindTimeout] and
// [KindParse].
func (k Kind) Retryable() bool {
	return k == KindTransient || k == KindTimeout || k == KindParse
}

// MarshalText encodes the Kind as its [Kind.String] name, so Kinds read
// well in JSON and in logs. A value outside the constants (a custom
// Chain.Classify may return one) encodes as "kind(N)" and decodes back.
func (k Kind) MarshalText() ([]byte, error) {
	return []byte(k.String()), nil
}

// UnmarshalText decodes a name written by [Kind.MarshalText]. An
// unrecognised name is an error and leaves k unchanged.
func (k *Kind) UnmarshalText(text []byte) error {
	for i, name := range kindNames {
		if string(text) == name {
			*k = Kind(i)
			return nil
		}
	}
	if digits, ok := strings.CutPrefix(string(text), "kind("); ok {
		if digits, ok := strings.CutSuffix(digits, ")"); ok {
			if n, err := strconv.ParseUint(digits, 10, 8); err == nil {
				*k = Kind(n)
				return nil
			}
		}
	}
	return fmt.Errorf("llmretry: unknown kind %q", text)
}

// ClassifyStatus maps an HTTP status code to a Kind: 408, 425, 429 and
// 500–599 are [KindTransient], any other 400–499 is [KindRejected], and
// everything else (including 2xx and 3xx) is [KindUnknown].
func ClassifyStatus(code int) Kind {
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests:
		return KindTransient
	case code >= 500 && code <= 599:
		return KindTransient
	case code >= 400 && code <= 499:
		return KindRejected
	}
	return KindUnknown
}

// Classify returns the Kind of err. It is the default for
// [Chain.Classify] and checks, in this order: [*Cancelled] is
// [KindCancelled]; [*Truncated] is [KindTruncated]; [*TimedOut] is
// [KindTimeout]; [*Exhausted] is the Kind of its last attempt; [*Failure]
// is its Kind; context.Canceled is [KindCancelled]; context.DeadlineExceeded
// or a net.Error whose Timeout() is true is [KindTimeout]; ECONNREFUSED,
// ECONNRESET, ECONNABORTED, EPIPE, io.ErrUnexpectedEOF, io.EOF (how net/http
// reports a connection closed before any response) and a failed dial are
// [KindTransient]. Anything else, nil included, is [KindUnknown].
//
// Each check walks the whole tree of wrapped errors, as errors.As does, so
// a type found deeper still wins over a later rule.
func Classify(err error) Kind {
	if err == nil {
		return KindUnknown
	}
	// The common case — a backend's bare *Failure — needs no walk, and the
	// walk below would find nothing else in it (#3: classification sits on
	// every failed attempt).
	if f, ok := err.(*Failure); ok && f != nil && f.Err == nil {
		return f.Kind
	}
	if _, ok := asType[*Cancelled](err); ok {
		return KindCancelled
	}
	if _, ok := asType[*Truncated](err); ok {
		return KindTruncated
	}
	if _, ok := asType[*TimedOut](err); ok {
		return KindTimeout
	}
	if e, ok := asType[*Exhausted](err); ok {
		if n := len(e.Attempts); n > 0 {
			return e.Attempts[n-1].Kind
		}
		return KindUnknown
	}
	if f, ok := asType[*Failure](err); ok && f != nil {
		return f.Kind
	}
	if errors.Is(err, context.Canceled) {
		return KindCancelled
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return KindTimeout
	}
	if netTimeout(err) {
		return KindTimeout
	}
	if errno, ok := asType[syscall.Errno](err); ok {
		switch errno {
		case syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE:
			return KindTransient
		}
	}
	// io.EOF is what net/http returns when the server closed the connection
	// before sending any response: nothing was processed, so it is safe to
	// send again.
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return KindTransient
	}
	if op, ok := asType[*net.OpError](err); ok && op.Op == "dial" {
		return KindTransient
	}
	return KindUnknown // conservatively: an unknown error falls over rather than hammering
}

// netTimeout reports whether any net.Error in err's tree says Timeout.
// errors.As would stop at the first net.Error, and a *url.Error over a
// %w-wrapped timeout answers false for the timeout beneath it (STYLE §10).
func netTimeout(err error) bool {
	for err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return true
		}
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if netTimeout(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// asType finds the first error in err's tree of type T, as errors.As
// does, without the allocation errors.As makes for its pointer target.
// errors.AsType does this from Go 1.26; the module still supports 1.25.
func asType[T error](err error) (T, bool) {
	var zero T
	for err != nil {
		if t, ok := err.(T); ok {
			return t, true
		}
		if x, ok := err.(interface{ As(any) bool }); ok {
			var t T
			if x.As(&t) {
				return t, true
			}
		}
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if t, ok := asType[T](e); ok {
					return t, true
				}
			}
			return zero, false
		default:
			return zero, false
		}
	}
	return zero, false
}

// ParseRetryAfter reads a server's hint of how long to wait from h:
// "retry-after-ms" (milliseconds, as OpenAI-compatible APIs send it), then
// "retry-after" as seconds or as an HTTP date, measured from now. A date in
// the past gives 0. It returns false when h holds no hint it can read;
// negative or malformed values are ignored.
func ParseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < maxHintMillis {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s >= 0 && s < maxHintMillis/1000 {
			return time.Duration(s * float64(time.Second)), true
		}
		return 0, false
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// maxHintMillis bounds a retry-after hint so that converting it to a
// Duration cannot overflow; any hint this long is far past every MaxWait.
const maxHintMillis = float64(1<<62) / float64(time.Millisecond)

// Failure is what a backend returns to say how it failed and what the
// model produced, so the chain can decide without guessing from text.
// Backends build one with [StatusFailure], [Truncation] or [ParseFailure],
// or as a literal. Wrapping a Failure with %w keeps it visible to the
// chain.
type Failure struct {
	Kind       Kind          // how it failed; decides retry and fall-over
	Status     int           // HTTP status, 0 if none
	RetryAfter time.Duration // the server's hint, 0 if none
	RawText    *string       // the model's output; nil when there is none worth keeping
	Err        error         // the cause, may be nil
}

// Error describes the failure as "http 503: cause" when it has a status,
// else as "kind: cause"; the cause is left out when Err is nil. It carries
// no "llmretry: " prefix because it is the backend's own report, printed
// inside the chain's attempt lines.
func (f *Failure) Error() string {
	if f == nil {
		return "llmretry: nil *Failure"
	}
	var b strings.Builder
	if f.Status != 0 {
		b.WriteString("http ")
		b.WriteString(strconv.Itoa(f.Status))
	} else {
		b.WriteString(f.Kind.String())
	}
	if f.Err != nil {
		b.WriteString(": ")
		b.WriteString(f.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause, so errors.Is and errors.As see through a
// Failure.
func (f *Failure) Unwrap() error {
	if f == nil {
		return nil
	}
	return f.Err
}

// StatusFailure describes an HTTP error response. Its Kind comes from
// [ClassifyStatus], overridden by an "x-should-retry: true" or "false"
// header; its RetryAfter from [ParseRetryAfter] on h. h may be nil.
func StatusFailure(code int, h http.Header, err error) *Failure {
	f := &Failure{Kind: ClassifyStatus(code), Status: code, Err: err}
	if h == nil {
		return f
	}
	// Providers that send x-should-retry know better than the status code
	// (a 409 lock conflict that will clear, a 500 that never will).
	switch strings.ToLower(strings.TrimSpace(h.Get("X-Should-Retry"))) {
	case "true":
		f.Kind = KindTransient
	case "false":
		f.Kind = KindRejected
	}
	if d, ok := ParseRetryAfter(h, time.Now()); ok {
		f.RetryAfter = d
	}
	return f
}

// Truncation describes a completion that stopped at its token budget
// (finish_reason "length"), keeping the partial output raw.
func Truncation(raw string) *Failure {
	return &Failure{Kind: KindTruncated, RawText: &raw}
}

// ParseFailure describes model output that could not be used, keeping
// the output raw so the caller can show what the model said.
func ParseFailure(raw string, err error) *Failure {
	return &Failure{Kind: KindParse, RawText: &raw, Err: err}
}

// Exhausted is the error of a chain whose every backend failed. It is also
// embedded in [Truncated] and [TimedOut], so errors.As to *Exhausted
// catches all three. Check [Cancelled] separately: it is not an Exhausted.
type Exhausted struct {
	Attempts []Attempt // one record per failed attempt, in order
	Summary  string    // the human-readable aggregate; generated when empty
}

// Error returns Summary, or when it is empty a generated summary: a first
// line naming what failed and the lever to pull, then each attempt on an
// indented line of its own.
func (e *Exhausted) Error() string {
	if e.Summary != "" {
		return e.Summary
	}
	return summarize("exhausted", e.Attempts, levers(e.Attempts, false))
}

// Unwrap returns each attempt's error in order, nil ones left out, so
// errors.Is and errors.As look into the attempts depth-first, first attempt
// first.
func (e *Exhausted) Unwrap() []error {
	errs := make([]error, 0, len(e.Attempts))
	for i := range e.Attempts {
		if err := e.Attempts[i].Err; err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// LogValue gives structured loggers the outcome and the attempts as
// fields, instead of the multi-line summary.
func (e *Exhausted) LogValue() slog.Value { return logValue("exhausted", e.Attempts) }

// Truncated is the [Exhausted] error of a chain in which at least one
// attempt was cut off at the completion budget. Raising the budget (max
// tokens) is the fix; re-running the same item is not, so it advises
// [RetryItem] false. Truncated beats [TimedOut] when both were seen.
type Truncated struct{ Exhausted }

// Error returns the summary, naming "raise the completion budget (max
// tokens)" as the lever, and the deadline too when an attempt timed out.
func (e *Truncated) Error() string {
	if e.Summary != "" {
		return e.Summary
	}
	return summarize("truncated", e.Attempts, levers(e.Attempts, false))
}

// Unwrap returns the embedded Exhausted, so handlers of *Exhausted catch a
// Truncated.
func (e *Truncated) Unwrap() error { return &e.Exhausted }

// ItemRetryable reports false: a completion cut off by its budget is cut
// off at the same place when the item is run again.
func (e *Truncated) ItemRetryable() bool { return false }

// LogValue gives structured loggers the outcome and the attempts as
// fields.
func (e *Truncated) LogValue() slog.Value { return logValue("truncated", e.Attempts) }

// TimedOut is the [Exhausted] error of a chain that ran out of time: an
// attempt hit a deadline, or the caller's deadline passed. It matches
// context.DeadlineExceeded with errors.Is and reports Timeout() true. It
// does not advise against re-running the item: a deadline miss is
// transient.
type TimedOut struct{ Exhausted }

// Error returns the summary, naming "raise the deadline" as the lever.
func (e *TimedOut) Error() string {
	if e.Summary != "" {
		return e.Summary
	}
	return summarize("timed out", e.Attempts, levers(e.Attempts, true))
}

// Unwrap returns the embedded Exhausted and context.DeadlineExceeded, so
// both errors.As to *Exhausted and errors.Is(err, context.DeadlineExceeded)
// hold.
func (e *TimedOut) Unwrap() []error { return []error{&e.Exhausted, context.DeadlineExceeded} }

// Timeout reports true, as net.Error timeouts do.
func (e *TimedOut) Timeout() bool { return true }

// LogValue gives structured loggers the outcome and the attempts as
// fields.
func (e *TimedOut) LogValue() slog.Value { return logValue("timed out", e.Attempts) }

// Cancelled is the error of a chain whose caller withdrew: its context was
// cancelled before a round trip, during a wait or mid-call, or an attempt
// failed with an error of [KindCancelled]. It is deliberately not an
// [Exhausted]: a user pressing Ctrl-C is not a model failure, and must not
// be counted or dead-lettered as one.
type Cancelled struct {
	Attempts []Attempt // the attempts made before the withdrawal, the interrupted one included
	Cause    error     // context.Cause of the caller's context, or the error that signalled withdrawal
}

// Error returns a one-line description: "llmretry: cancelled after N
// attempts: cause".
func (c *Cancelled) Error() string {
	var b strings.Builder
	b.WriteString("llmretry: cancelled after ")
	writeCount(&b, len(c.Attempts), "attempt")
	if c.Cause != nil {
		b.WriteString(": ")
		b.WriteString(c.Cause.Error())
	}
	return b.String()
}

// Unwrap returns Cause and context.Canceled, so errors.Is holds for both.
// The Cause is shielded: errors.As does not find an [Exhausted] (or
// Truncated, TimedOut) or [ItemRetryable] advice beneath it, because a
// Cancelled is never an Exhausted, whatever cancelled it. (errgroup, for
// one, cancels its context with a sibling's error as the cause, and that
// sibling's Truncated must not make this call look truncated.) Read the
// Cause field to inspect it.
func (c *Cancelled) Unwrap() []error {
	if c.Cause == nil {
		return []error{context.Canceled}
	}
	return []error{shieldedCause{c.Cause}, context.Canceled}
}

// shieldedCause is how a Cancelled exposes its Cause: errors.Is and
// errors.As see through it, except to the chain's own failure types and
// advice.
type shieldedCause struct{ err error }

func (s shieldedCause) Error() string { return s.err.Error() }

// Is reports whether the cause matches target, so errors.Is(err, cause)
// holds for a Cancelled.
func (s shieldedCause) Is(target error) bool { return errors.Is(s.err, target) }

// As finds target in the cause, unless target is one of the chain's
// failure types or the advice interface.
func (s shieldedCause) As(target any) bool {
	switch target.(type) {
	case **Exhausted, **Truncated, **TimedOut, *ItemRetryable:
		return false
	}
	return errors.As(s.err, target)
}

// LogValue gives structured loggers the outcome, the cause and the
// attempts as fields.
func (c *Cancelled) LogValue() slog.Value {
	v := logValue("cancelled", c.Attempts)
	if c.Cause == nil {
		return v
	}
	return slog.GroupValue(append(v.Group(), slog.String("cause", c.Cause.Error()))...)
}

// Exhaust returns the typed error for a chain whose attempts all failed,
// by precedence: [*Truncated] when any attempt is [KindTruncated], else
// [*TimedOut] when any is [KindTimeout], else [*Exhausted]. The error keeps
// attempts as given; it is never nil.
func Exhaust(attempts []Attempt) error {
	return exhaust(attempts, false)
}

// exhaust is Exhaust for the chain, which also knows whether the caller's
// deadline ran out.
func exhaust(attempts []Attempt, deadline bool) error {
	truncated, timedOut := seen(attempts)
	switch {
	case truncated && deadline && !timedOut:
		// The deadline ran out between attempts, so no record shows it;
		// the generated summary could not name that lever.
		return &Truncated{Exhausted{Attempts: attempts, Summary: summarize("truncated", attempts, levers(attempts, true))}}
	case truncated:
		return &Truncated{Exhausted{Attempts: attempts}}
	case timedOut || deadline:
		return &TimedOut{Exhausted{Attempts: attempts}}
	}
	return &Exhausted{Attempts: attempts}
}

// seen reports whether any attempt was truncated or timed out.
func seen(attempts []Attempt) (truncated, timedOut bool) {
	for i := range attempts {
		switch attempts[i].Kind {
		case KindTruncated:
			truncated = true
		case KindTimeout:
			timedOut = true
		}
	}
	return truncated, timedOut
}

// levers names the fixes the attempts point at. A deadline that ran out is
// always worth naming for a TimedOut, even when no attempt was under way.
func levers(attempts []Attempt, deadline bool) string {
	truncated, timedOut := seen(attempts)
	switch {
	case truncated && (timedOut || deadline):
		return "raise the completion budget (max tokens) and raise the deadline"
	case truncated:
		return "raise the completion budget (max tokens)"
	case timedOut || deadline:
		return "raise the deadline"
	}
	return "every backend failed; add a backend or widen the retry waits"
}

// summarize builds the multi-line message of the Exhausted family.
func summarize(what string, attempts []Attempt, lever string) string {
	var b strings.Builder
	b.WriteString("llmretry: ")
	b.WriteString(what)
	if len(attempts) == 0 {
		b.WriteString(" before any attempt")
	} else {
		b.WriteString(" after ")
		writeCount(&b, len(attempts), "attempt")
		b.WriteString(" on ")
		writeCount(&b, countBackends(attempts), "backend")
	}
	b.WriteString(": ")
	b.WriteString(lever)
	for i := range attempts {
		b.WriteString("\n\t")
		b.WriteString(attempts[i].String())
	}
	return b.String()
}

// writeCount writes "1 attempt" or "3 attempts".
func writeCount(b *strings.Builder, n int, noun string) {
	b.WriteString(strconv.Itoa(n))
	b.WriteByte(' ')
	b.WriteString(noun)
	if n != 1 {
		b.WriteByte('s')
	}
}

// countBackends counts the distinct backends among the attempts.
func countBackends(attempts []Attempt) int {
	var seen []int
	for i := range attempts {
		found := false
		for _, s := range seen {
			if s == attempts[i].Backend {
				found = true
				break
			}
		}
		if !found {
			seen = append(seen, attempts[i].Backend)
		}
	}
	return len(seen)
}

// logValue is the slog group shared by the chain's error types.
func logValue(outcome string, attempts []Attempt) slog.Value {
	records := make([]slog.Attr, len(attempts))
	for i := range attempts {
		records[i] = slog.Any(strconv.Itoa(i), attempts[i])
	}
	return slog.GroupValue(
		slog.String("outcome", outcome),
		slog.Int("attempts", len(attempts)),
		slog.Attr{Key: "records", Value: slog.GroupValue(records...)},
	)
}
