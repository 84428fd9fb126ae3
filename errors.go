package llmretry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Exhausted is the error of a chain whose every backend failed. It is also
// embedded in [Truncated] and [TimedOut], so errors.As to *Exhausted
// catches all three. Check [Cancelled] separately: it is not an Exhausted.
//
// Its error tree holds the outcome and nothing else: errors.Is and
// errors.As answer for the chain's decision, never for an attempt's error.
// A backend's [*Failure], an SDK's error, a context.Canceled that a client
// returned or a sentinel of the caller's own stay in Attempts[i].Err, where
// the records keep them; look there to reach them. The last provider
// error is the Err of the last record that has one (a record skipped for
// its breaker sent nothing and has none).
type Exhausted struct {
	Attempts []Attempt // one record per failed attempt or skip, in order
}

// Error returns a summary for people: a first line naming what failed,
// the attempts sent and the skips counted apart, and the lever to pull,
// then each attempt on an indented line of its own (an inner chain's
// attempts indented under the attempt that ran it; past 20 records, the
// first and last 10 and a line counting the rest). Secrets are redacted
// ([Redact]).
func (e *Exhausted) Error() string { return summarize("exhausted", e.Attempts) }

// ItemRetryable reports false when the chain stopped on a provider's
// refusal of the content ([KindRefused]), or when there are attempts and
// every one was [KindRejected], [KindTruncated] or [KindRefused]: every
// backend refused this exact request (a context-length 400 on all of
// them, a content filter) and would again. Otherwise it reports true. It
// answers for the whole error: whatever the attempts' own errors advise is
// not consulted.
func (e *Exhausted) ItemRetryable() bool {
	if stoppedRefused(e.Attempts) {
		return false
	}
	return !allRequestRefused(e.Attempts)
}

// allRequestRefused reports whether there are attempts and every one was
// [KindRejected], [KindTruncated] or [KindRefused]: about the request,
// which every backend would refuse again.
func allRequestRefused(attempts []Attempt) bool {
	for i := range attempts {
		if k := attempts[i].Kind; k != KindRejected && k != KindTruncated && k != KindRefused {
			return false
		}
	}
	return len(attempts) > 0
}

// anyStatus reports whether an attempt was answered with HTTP status code.
func anyStatus(attempts []Attempt, code int) bool {
	for i := range attempts {
		if attempts[i].Status == code {
			return true
		}
	}
	return false
}

// stoppedRefused reports whether the chain stopped because a provider
// refused the content.
func stoppedRefused(attempts []Attempt) bool {
	n := len(attempts)
	return n > 0 && attempts[n-1].Why == WhyRefused
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
// "exhausted", item_retryable, error (the redacted Error text), usage
// (the total the attempts' records carry, absent when none carries any),
// usage_unknown (how many attempts may have reached a provider and have
// no known cost, 0 included; see [TotalUsage]) and attempts (as
// [Attempt.MarshalJSON] writes them, raw output redacted). [DecodeError]
// reads it back.
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
//
// errors.As finds it and its Exhausted; errors.Is matches nothing else,
// not even context.DeadlineExceeded when the deadline also ran out (the
// lever in its summary says so).
type Truncated struct{ Exhausted }

// Error returns the summary, naming "raise the completion budget (max
// tokens)" as the lever, and the deadline too when it ran out.
func (e *Truncated) Error() string { return summarize("truncated", e.Attempts) }

// Unwrap returns the embedded Exhausted, so handlers of *Exhausted catch a
// Truncated. It is the only error in the tree beneath a Truncated.
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
// attempt hit a deadline, or the caller's deadline passed. Retries that
// stopped because the next wait would not leave the reserve give an
// Exhausted instead: nothing ran out of time. It reports
// Timeout() true and advises [RetryItem] true: a deadline miss is
// transient.
//
// errors.As finds it and its Exhausted. errors.Is matches
// context.DeadlineExceeded and the Cause itself: errors.Is(err, cause)
// holds for the very value passed to context.WithTimeoutCause or
// WithDeadlineCause (compared with ==), not for what that value wraps, and
// errors.As never looks into the Cause; read the field for that. It never
// matches context.Canceled, whatever the Cause or an attempt's error
// wraps: a stream that stalled and whose client returned ctx.Err() timed
// out, it was not cancelled.
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
func (e *TimedOut) Error() string { return summarize("timed out", e.Attempts) }

// Unwrap returns the embedded Exhausted, so handlers of *Exhausted catch a
// TimedOut. It is the only error in the tree beneath a TimedOut.
func (e *TimedOut) Unwrap() error { return &e.Exhausted }

// Is reports whether target is context.DeadlineExceeded or the Cause
// itself. It does not look into the Cause.
func (e *TimedOut) Is(target error) bool {
	return target == context.DeadlineExceeded || sameError(e.Cause, target)
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
//
// errors.Is matches context.Canceled and nothing else; errors.As finds the
// Cancelled and nothing else. The Cause is a field to read, not part of
// the tree, as ctx.Err() and context.Cause are apart: errgroup, for one,
// cancels its context with a sibling's error as the cause, and that
// sibling's 400 or Truncated is not this call's outcome.
type Cancelled struct {
	Attempts []Attempt // the attempts made before the withdrawal, the interrupted one included
	Cause    error     // context.Cause of the caller's context, or the error that signalled withdrawal
}

// Error returns a one-line description: "llmretry: cancelled after N
// attempts: cause" (skips counted apart, as in [Exhausted.Error]), with
// secrets redacted.
func (c *Cancelled) Error() string {
	var b strings.Builder
	b.WriteString("llmretry: cancelled")
	writeRecords(&b, c.Attempts, false)
	if c.Cause != nil {
		b.WriteString(": ")
		b.WriteString(firstLine(c.Cause.Error()))
	}
	return Redact(b.String())
}

// Is reports whether target is context.Canceled.
func (c *Cancelled) Is(target error) bool { return target == context.Canceled }

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
			// No usage: an inner chain reports what it cost to the
			// attempt that ran it through the context, when it returns.
			return kind, detail{status: a.Status, raw: a.RawText, hint: a.RetryAfter}
		}
	}
	return kind, detail{}
}

// sameError reports whether err is target itself, compared as errors.Is
// compares a node with its target: with ==, when target's type allows it.
func sameError(err, target error) bool {
	if err == nil || target == nil {
		return false
	}
	if t := reflect.TypeOf(target); !t.Comparable() {
		return false
	}
	return err == target
}

// Exhaust returns the error of a chain whose every backend failed, chosen
// from its records as [Chain.Do] chooses it, by precedence:
//   - [*Truncated] when any attempt sent was [KindTruncated];
//   - else [*TimedOut] when any attempt sent was [KindTimeout], or when the
//     last record says the caller's deadline ran out (Why [WhyDeadline]: an
//     attempt, a wait or a wait for a breaker that the deadline ended); its
//     Cause is nil, since records do not keep it;
//   - else [*Exhausted].
//
// A record skipped for its breaker counts for neither truncated nor timed
// out: nothing was sent, so nothing was cut off or ran out of time. The
// error keeps attempts as given; it is never nil, and never a [*Cancelled]:
// records whose last one says the caller withdrew (Why [WhyCancelled])
// are a Cancelled's, which Do returns and Exhaust does not build. For any
// other records Do left, Exhaust returns the type Do returned, except for
// none at all: Do, whose deadline passed (or whose context was cancelled)
// before any record, returns a *TimedOut (or a *Cancelled) with no
// attempts, and Exhaust(nil) an *Exhausted.
func Exhaust(attempts []Attempt) error {
	return exhaust(attempts, false, nil)
}

// conclude is the error of a call that stopped with attempts. ctxErr and
// cause are the caller's context's Err and Cause when Do stopped (nil
// while it was live; for a withdrawal that the backend reported, the
// backend's error is the cause). The caller's withdrawal, as the last
// record or ctxErr says it, wins over the attempts' own failures;
// otherwise the records decide as they do for [Exhaust].
func conclude(attempts []Attempt, ctxErr, cause error) error {
	if withdrew(attempts) || errors.Is(ctxErr, context.Canceled) {
		return &Cancelled{Attempts: attempts, Cause: cause}
	}
	return exhaust(attempts, ctxErr != nil, cause)
}

// withdrew reports whether the last record says the caller withdrew, or
// the backend said it had.
func withdrew(attempts []Attempt) bool {
	n := len(attempts)
	if n == 0 {
		return false
	}
	last := &attempts[n-1]
	return last.Why == WhyCancelled || (last.Kind == KindCancelled && !last.Skipped)
}

// exhaust is the Exhausted-family error of attempts. deadline says Do saw
// its context's deadline pass, and cause is then that context's Cause:
// Do's records already say so in their last Why, and deadline speaks for
// a call that ended before any record (and keeps Do's answer should a
// record ever not say it).
func exhaust(attempts []Attempt, deadline bool, cause error) error {
	if n := len(attempts); n > 0 && attempts[n-1].Why == WhyDeadline {
		deadline = true
	}
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
	var delivered, deadline, reserve, maxWait, breaker, paced bool
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
		case WhyPaced:
			paced = paced || attempts[i].Next != NextRetry
		}
	}
	if delivered {
		return "output was already delivered, so nothing was resent and no other backend was tried"
	}
	if stoppedRefused(attempts) || allKind(attempts, KindRefused) {
		return "the provider refused the content; running it again will not help"
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
	if paced {
		levers = append(levers, "the providers' rate limits held requests back longer than the waits allowed (Policy.MaxWait, Policy.Reserve, the deadline): add capacity, or a backend with its own")
	}
	if len(levers) == 0 && allRequestRefused(attempts) {
		if anyStatus(attempts, http.StatusTooManyRequests) {
			// A 429 that is rejected is a spent quota: the request is
			// fine, the account is not.
			return "every backend rejected this request, a spent quota among them; running it again helps only once the quota is raised or resets"
		}
		return "every backend rejected this request; change the request, since running it again will not help"
	}
	if len(levers) == 0 {
		return "every backend failed; add a backend or widen the retry waits"
	}
	return strings.Join(levers, "; ")
}

// allKind reports whether there are attempts and every one was of Kind k.
func allKind(attempts []Attempt, k Kind) bool {
	for i := range attempts {
		if attempts[i].Kind != k {
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
		writeRecords(&b, attempts, true)
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

// writeRecords writes " after 3 attempts and 1 skip on 2 backends": the
// requests sent and the skips for a breaker counted apart (a skip sent
// nothing, so counting it as an attempt would overstate the load put on
// the providers), skips left out when there are none, and the backends
// only when asked.
func writeRecords(b *strings.Builder, attempts []Attempt, backends bool) {
	skips := 0
	for i := range attempts {
		if attempts[i].Skipped {
			skips++
		}
	}
	b.WriteString(" after ")
	writeCount(b, len(attempts)-skips, "attempt")
	if skips > 0 {
		b.WriteString(" and ")
		writeCount(b, skips, "skip")
	}
	if backends {
		b.WriteString(" on ")
		writeCount(b, countBackends(attempts), "backend")
	}
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
	if total, ok := knownUsage(attempts); ok {
		attrs = append(attrs, slog.Group("usage", usageAttrs(total)...))
	}
	if _, unknown := TotalUsage(attempts); unknown > 0 {
		attrs = append(attrs, slog.Int("usage_unknown", unknown))
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
	Usage         *Usage    `json:"usage,omitempty"` // the total the attempts' records carry; absent when none carries any
	UsageUnknown  int       `json:"usage_unknown"`   // attempts that may have reached a provider whose cost is unknown (see TotalUsage); 0 is written
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
	j.Usage = usagePtr(attempts)
	_, j.UsageUnknown = TotalUsage(attempts)
	return json.Marshal(j)
}
