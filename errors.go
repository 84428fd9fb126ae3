package llmretry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Exhausted is the error of a chain whose every backend failed. It is also
// embedded in [Truncated] and [TimedOut], so errors.As to *Exhausted
// catches all three. Check [Cancelled] separately: it is not an Exhausted.
type Exhausted struct {
	Attempts []Attempt // one record per failed attempt, in order
	Summary  string    // the human-readable aggregate; generated when empty
}

// Error returns Summary, or when it is empty a generated summary: a first
// line naming what failed and the lever to pull, then each attempt on an
// indented line of its own (an inner chain's attempts indented under the
// attempt that ran it; past 20 attempts, the first and last 10 and a line
// counting the rest). Secrets are redacted ([Redact]).
func (e *Exhausted) Error() string {
	if e.Summary != "" {
		return Redact(e.Summary)
	}
	return summarize("exhausted", e.Attempts)
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

// ItemRetryable reports false when there are attempts and every one was
// [KindRejected] or [KindTruncated]: every backend refused this exact
// request (a context-length 400 on all of them, a content-policy 403) and
// would again. Otherwise it reports true. It answers for the whole error:
// whatever the attempts' own errors advise is not consulted.
func (e *Exhausted) ItemRetryable() bool {
	for i := range e.Attempts {
		if k := e.Attempts[i].Kind; k != KindRejected && k != KindTruncated {
			return true
		}
	}
	return len(e.Attempts) == 0
}

// ItemRetryAfter advises when the item could first run again: when the
// last attempt of every backend that has one carried a retry-after hint
// (a skip's counts, until the breaker half-opens), the time from now
// until the soonest of them runs out (the earliest any backend said it
// would take work again); 0 when a backend gave no hint or the moment has
// passed. See [RetryItemAfter].
func (e *Exhausted) ItemRetryAfter() time.Duration { return retryAfter(e.Attempts, time.Now()) }

// LogValue gives structured loggers the outcome and the attempts as
// fields, instead of the multi-line summary.
func (e *Exhausted) LogValue() slog.Value { return logValue("exhausted", e, e.Attempts, nil) }

// MarshalJSON encodes the record a dead-letter table keeps: outcome
// "exhausted", item_retryable, error (the redacted Error text) and
// attempts.
func (e *Exhausted) MarshalJSON() ([]byte, error) {
	return marshalError("exhausted", e, e.Attempts, nil)
}

// outcome is the Kind of the last attempt, with that attempt's details.
func (e *Exhausted) outcome() (Kind, detail) {
	if n := len(e.Attempts); n > 0 {
		return lastOf(e.Attempts, e.Attempts[n-1].Kind)
	}
	return KindUnknown, detail{}
}

// Truncated is the [Exhausted] error of a chain in which at least one
// attempt was cut off at the completion budget. Raising the budget (max
// tokens) is the fix; re-running the same item is not, so it advises
// [RetryItem] false. Truncated beats [TimedOut] when both were seen.
type Truncated struct{ Exhausted }

// Error returns the summary, naming "raise the completion budget (max
// tokens)" as the lever, and the deadline too when it ran out.
func (e *Truncated) Error() string {
	if e.Summary != "" {
		return Redact(e.Summary)
	}
	return summarize("truncated", e.Attempts)
}

// Unwrap returns the embedded Exhausted, so handlers of *Exhausted catch a
// Truncated.
func (e *Truncated) Unwrap() error { return &e.Exhausted }

// ItemRetryable reports false: a completion cut off by its budget is cut
// off at the same place when the item is run again.
func (e *Truncated) ItemRetryable() bool { return false }

// ItemRetryAfter reports 0: a truncated item's advice is never to run it
// again, so there is no time to wait for. (Without this, Truncated would
// take Exhausted's advice.)
func (e *Truncated) ItemRetryAfter() time.Duration { return 0 }

// LogValue gives structured loggers the outcome and the attempts as
// fields.
func (e *Truncated) LogValue() slog.Value { return logValue("truncated", e, e.Attempts, nil) }

// MarshalJSON encodes the dead-letter record, with outcome "truncated".
func (e *Truncated) MarshalJSON() ([]byte, error) {
	return marshalError("truncated", e, e.Attempts, nil)
}

// outcome is truncated, with the last truncated attempt's details (its
// partial output among them).
func (e *Truncated) outcome() (Kind, detail) { return lastOf(e.Attempts, KindTruncated) }

// TimedOut is the [Exhausted] error of a chain that ran out of time: an
// attempt hit a deadline, or the caller's deadline passed. It matches
// context.DeadlineExceeded and its Cause with errors.Is, and reports
// Timeout() true. It advises [RetryItem] true: a deadline miss is
// transient.
type TimedOut struct {
	Exhausted
	// Cause is context.Cause of the caller's context when its deadline
	// passed, as set with context.WithTimeoutCause or WithDeadlineCause;
	// nil when the deadline was plain or only attempts timed out.
	Cause error
}

// Error returns the summary, naming the deadline as the lever when the
// caller's deadline passed, and the backends' timeouts when only they
// ran out.
func (e *TimedOut) Error() string {
	if e.Summary != "" {
		return Redact(e.Summary)
	}
	return summarize("timed out", e.Attempts)
}

// Unwrap returns the embedded Exhausted, context.DeadlineExceeded and
// Cause, so errors.As to *Exhausted, errors.Is(err,
// context.DeadlineExceeded) and errors.Is(err, cause) all hold. As for a
// [Cancelled], errors.As finds no Exhausted or advice through the Cause.
func (e *TimedOut) Unwrap() []error {
	if e.Cause == nil {
		return []error{&e.Exhausted, context.DeadlineExceeded}
	}
	return []error{&e.Exhausted, context.DeadlineExceeded, shieldedCause{e.Cause}}
}

// Timeout reports true, as net.Error timeouts do.
func (e *TimedOut) Timeout() bool { return true }

// ItemRetryable reports true: a deadline miss says nothing about the item.
func (e *TimedOut) ItemRetryable() bool { return true }

// LogValue gives structured loggers the outcome, the cause and the
// attempts as fields.
func (e *TimedOut) LogValue() slog.Value { return logValue("timed_out", e, e.Attempts, e.Cause) }

// MarshalJSON encodes the dead-letter record, with outcome "timed_out"
// and the cause's text when there is one.
func (e *TimedOut) MarshalJSON() ([]byte, error) {
	return marshalError("timed_out", e, e.Attempts, e.Cause)
}

// outcome is timeout, with the last timed-out attempt's details.
func (e *TimedOut) outcome() (Kind, detail) { return lastOf(e.Attempts, KindTimeout) }

// Cancelled is the error of a chain whose caller withdrew: its context was
// cancelled before a round trip, during a wait or mid-call, or an attempt
// failed with an error of [KindCancelled]. It is deliberately not an
// [Exhausted]: a user pressing Ctrl-C is not a model failure, and must not
// be counted or dead-lettered as one. It advises [RetryItem] true and
// reports Timeout() false, whatever its Cause says.
type Cancelled struct {
	Attempts []Attempt // the attempts made before the withdrawal, the interrupted one included
	Cause    error     // context.Cause of the caller's context, or the error that signalled withdrawal
}

// Error returns a one-line description: "llmretry: cancelled after N
// attempts: cause", with secrets redacted.
func (c *Cancelled) Error() string {
	var b strings.Builder
	b.WriteString("llmretry: cancelled after ")
	writeCount(&b, len(c.Attempts), "attempt")
	if c.Cause != nil {
		b.WriteString(": ")
		b.WriteString(firstLine(c.Cause.Error()))
	}
	return Redact(b.String())
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

// ItemRetryable reports true: a withdrawal says nothing about the item.
func (c *Cancelled) ItemRetryable() bool { return true }

// Timeout reports false: the caller withdrew, whatever its cause says, so
// a probe for Timeout stops here.
func (c *Cancelled) Timeout() bool { return false }

// LogValue gives structured loggers the outcome, the cause and the
// attempts as fields.
func (c *Cancelled) LogValue() slog.Value { return logValue("cancelled", c, c.Attempts, c.Cause) }

// MarshalJSON encodes the record, with outcome "cancelled" and the cause's
// text.
func (c *Cancelled) MarshalJSON() ([]byte, error) {
	return marshalError("cancelled", c, c.Attempts, c.Cause)
}

// outcome is cancelled, with the interrupted attempt's details.
func (c *Cancelled) outcome() (Kind, detail) { return lastOf(c.Attempts, KindCancelled) }

// lastOf returns kind with the details of the last attempt of that kind;
// none when no attempt has it.
func lastOf(attempts []Attempt, kind Kind) (Kind, detail) {
	for i := len(attempts) - 1; i >= 0; i-- {
		if a := &attempts[i]; a.Kind == kind {
			return kind, detail{a.Status, a.RawText, a.RetryAfter}
		}
	}
	return kind, detail{}
}

// shieldedCause is how a Cancelled or TimedOut exposes its Cause:
// errors.Is and errors.As see through it, except to the chain's own
// failure types and advice.
type shieldedCause struct{ err error }

func (s shieldedCause) Error() string { return Redact(s.err.Error()) }

// Is reports whether the cause matches target, so errors.Is(err, cause)
// holds; but not context.DeadlineExceeded, which the error itself answers
// for (a Cancelled whose cause is a sibling's TimedOut did not time out).
func (s shieldedCause) Is(target error) bool {
	return target != context.DeadlineExceeded && errors.Is(s.err, target)
}

// As finds target in the cause, unless target is one of the chain's
// failure types or the advice interface.
func (s shieldedCause) As(target any) bool {
	switch target.(type) {
	case **Exhausted, **Truncated, **TimedOut, *ItemRetryable, *ItemRetryAfter, *typedError:
		return false
	}
	return errors.As(s.err, target)
}

// Exhaust returns the typed error for a chain whose attempts all failed,
// by precedence: [*Truncated] when any attempt is [KindTruncated], else
// [*TimedOut] when any is [KindTimeout], else [*Exhausted]. Attempts a
// breaker skipped count for neither: nothing was cut off or timed out. The error keeps
// attempts as given; it is never nil.
func Exhaust(attempts []Attempt) error {
	return exhaust(attempts, false, nil)
}

// exhaust is Exhaust for the chain, which also knows whether the caller's
// deadline ran out, and its cause.
func exhaust(attempts []Attempt, deadline bool, cause error) error {
	truncated, timedOut := seen(attempts)
	switch {
	case truncated:
		return &Truncated{Exhausted{Attempts: attempts}}
	case timedOut || deadline:
		if !deadline || cause == context.DeadlineExceeded {
			cause = nil // a plain deadline, or none: nothing to add
		}
		return &TimedOut{Exhausted: Exhausted{Attempts: attempts}, Cause: cause}
	}
	return &Exhausted{Attempts: attempts}
}

// seen reports whether any attempt was truncated or timed out. An
// attempt skipped for its breaker counts for neither: the call itself was
// not cut off, nor did it run out of time there.
func seen(attempts []Attempt) (truncated, timedOut bool) {
	for i := range attempts {
		if attempts[i].Skipped {
			continue
		}
		switch attempts[i].Kind {
		case KindTruncated:
			truncated = true
		case KindTimeout:
			timedOut = true
		}
	}
	return truncated, timedOut
}

// lever names the fixes the attempts point at, from what they were and
// why the chain stopped retrying. A TimedOut with no record ran out of
// time before its first attempt.
func lever(what string, attempts []Attempt) string {
	var delivered, deadline, reserve, maxWait, breaker bool
	truncated, timedOut := seen(attempts)
	for i := range attempts {
		switch attempts[i].Why {
		case WhyDelivered:
			delivered = true
		case WhyDeadline:
			deadline = true
		case WhyReserve:
			reserve = true
		case WhyMaxWait:
			maxWait = true
		case WhyBreaker:
			breaker = true
		}
	}
	if delivered {
		return "output was already delivered, so nothing was resent and no other backend was tried"
	}
	if what == "timed out" && len(attempts) == 0 {
		deadline = true
	}
	var levers []string
	if truncated {
		levers = append(levers, "raise the completion budget (max tokens)")
	}
	switch {
	case deadline:
		levers = append(levers, "raise the deadline")
	case timedOut:
		// The caller set no deadline that ran out, so the attempts' own
		// limits are what to change.
		levers = append(levers, "raise the backends' Timeout or StallTimeout")
	}
	if reserve {
		levers = append(levers, "retries stopped where the next wait would not leave the reserve before the deadline (Policy.Reserve)")
	}
	if maxWait {
		levers = append(levers, "retries stopped because a server asked to wait longer than Policy.MaxWait")
	}
	if breaker {
		levers = append(levers, "backends were skipped while their breakers were open")
	}
	if len(levers) == 0 && refused(attempts) {
		return "every backend rejected this request; change the request, since running it again will not help"
	}
	if len(levers) == 0 {
		return "every backend failed; add a backend or widen the retry waits"
	}
	return strings.Join(levers, "; ")
}

// refused reports whether there are attempts and every one was rejected.
func refused(attempts []Attempt) bool {
	for i := range attempts {
		if attempts[i].Kind != KindRejected {
			return false
		}
	}
	return len(attempts) > 0
}

// summarize builds the multi-line message of the Exhausted family.
func summarize(what string, attempts []Attempt) string {
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
	b.WriteString(lever(what, attempts))
	writeAttempts(&b, attempts, "\n\t")
	return b.String()
}

// shownAttempts is how many attempts a summary lists at each end: a long
// outage must not make a message of megabytes. The records stay complete.
const shownAttempts = 10

// writeAttempts writes one line per attempt, each after indent, and an
// inner chain's attempts one level deeper under the attempt that ran it.
func writeAttempts(b *strings.Builder, attempts []Attempt, indent string) {
	for i := 0; i < len(attempts); i++ {
		if i == shownAttempts && len(attempts) > 2*shownAttempts {
			left := len(attempts) - 2*shownAttempts
			b.WriteString(indent)
			b.WriteString("... ")
			writeCount(b, left, "more attempt")
			b.WriteString(" left out")
			i += left
		}
		b.WriteString(indent)
		b.WriteString(attempts[i].String())
		if inner := innerAttempts(attempts[i].Err); len(inner) > 0 {
			writeAttempts(b, inner, indent+"\t")
		}
	}
}

// innerAttempts returns the attempts of an inner chain whose error err is,
// or nil.
func innerAttempts(err error) []Attempt {
	var t typedError
	if !errors.As(err, &t) {
		return nil
	}
	switch e := t.(type) {
	case *Exhausted:
		return e.Attempts
	case *Truncated:
		return e.Attempts
	case *TimedOut:
		return e.Attempts
	case *Cancelled:
		return e.Attempts
	case *Failure:
		// A backend that wrapped an inner chain's error in a Failure of its
		// own still ran those attempts.
		if e != nil {
			return innerAttempts(e.Err)
		}
	}
	return nil
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
	seen := map[int]bool{}
	for i := range attempts {
		seen[attempts[i].Backend] = true
	}
	return len(seen)
}

// firstLine returns s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// adviser is an error of ours that declares its own advice.
type adviser interface {
	error
	ItemRetryable() bool
}

// logValue is the slog group shared by the chain's error types.
func logValue(outcome string, err adviser, attempts []Attempt, cause error) slog.Value {
	records := make([]slog.Attr, len(attempts))
	for i := range attempts {
		records[i] = slog.Any(strconv.Itoa(i), attempts[i])
	}
	attrs := []slog.Attr{
		slog.String("outcome", outcome),
		slog.Bool("item_retryable", err.ItemRetryable()),
		slog.Int("attempts", len(attempts)),
	}
	if cause != nil {
		attrs = append(attrs, slog.String("cause", Redact(cause.Error())))
	}
	attrs = append(attrs, slog.Attr{Key: "records", Value: slog.GroupValue(records...)})
	return slog.GroupValue(attrs...)
}

// errorJSON is the dead-letter record of one of the chain's errors.
type errorJSON struct {
	Outcome       string    `json:"outcome"`
	ItemRetryable bool      `json:"item_retryable"`
	Error         string    `json:"error"`
	Cause         string    `json:"cause,omitempty"`
	Attempts      []Attempt `json:"attempts"`
}

// marshalError encodes err's dead-letter record.
func marshalError(outcome string, err adviser, attempts []Attempt, cause error) ([]byte, error) {
	j := errorJSON{
		Outcome:       outcome,
		ItemRetryable: err.ItemRetryable(),
		Error:         err.Error(),
		Attempts:      attempts,
	}
	if j.Attempts == nil {
		j.Attempts = []Attempt{} // a table reads [] more easily than null
	}
	if cause != nil {
		j.Cause = Redact(cause.Error())
	}
	return json.Marshal(j)
}
