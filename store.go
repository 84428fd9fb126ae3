package llmretry

import (
	"context"
	"time"
)

// BreakerStore keeps the [SharedState] of breakers that several processes
// share, one state per key, and changes it atomically. It holds no rules:
// a [Breaker] loads the state, decides with its own rules, and writes the
// result back with CompareAndSwap, deciding again when another process
// changed the state in between.
//
// A store must be safe for concurrent use. Every method is called with a
// context that the Breaker bounds by its StoreTimeout; a method should
// return promptly, with an error, when the context is done. An error (or
// a timeout) never fails a call: the Breaker decides from its own state
// for that call and tries the store again on its next decision.
//
// On PostgreSQL a store is one row per key: the key, a version column and
// the state (JSON); CompareAndSwap is an UPDATE (or, at version 0, an
// INSERT … ON CONFLICT DO NOTHING) that matches on the version, and
// Watch is a LISTEN on a channel that CompareAndSwap NOTIFYs.
type BreakerStore interface {
	// Load returns the state stored for key and its version. A key never
	// written is not an error: Load returns the zero SharedState and
	// version 0.
	Load(ctx context.Context, key string) (state SharedState, version int64, err error)

	// CompareAndSwap stores next for key when the stored version is
	// still version (0: nothing stored yet), and then the stored
	// version becomes greater than version. It returns false, with a nil
	// error, when the stored version is another: someone changed the
	// state since it was loaded, and nothing was written.
	CompareAndSwap(ctx context.Context, key string, version int64, next SharedState) (ok bool, err error)

	// Watch returns a channel that receives a value soon after the state
	// of key changes (a change this process made may be sent too), until
	// ctx is done; then the store closes it. The channel may drop values
	// when the receiver is slow: a value means "load again", not which
	// change. A nil channel with a nil error means the store cannot
	// watch, and the Breaker polls instead.
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

// SharedFormat is the [SharedState.Format] this version of the package
// writes. A Breaker that loads a state of a newer format does not use
// it, and decides from its own state as when the store fails: a fleet in
// the middle of an upgrade stays safe, if not shared.
const SharedFormat = 1

// SharedState is everything a fleet of processes must agree on about one
// backend: what a [Breaker] keeps, less the line of calls waiting in each
// process. It is a plain value, encoded as JSON by a store that needs
// bytes; its zero value is a closed breaker that has seen nothing.
//
// Times are wall-clock times of the processes that wrote them: a fleet
// sharing a store must keep its clocks in step (NTP keeps them within
// milliseconds, far less than any cooldown or pacing interval).
type SharedState struct {
	// Format is the layout of this value; SharedFormat when written by
	// this package, 0 when nothing was written.
	Format int `json:"format"`

	Failures int       `json:"failures,omitempty"` // consecutive retryable failures, across the fleet
	Until    time.Time `json:"until,omitzero"`     // open until then; zero when closed
	Kind     Kind      `json:"kind,omitempty"`     // the Kind of the failure that opened it
	Hinted   bool      `json:"hinted,omitempty"`   // a retry-after hint set Until
	Opened   int       `json:"opened,omitempty"`   // times it has opened, across the fleet

	// The half-open probe, as a lease: the process (ProbeOwner, a
	// Breaker's own random id) that sends it holds it until ProbeUntil.
	// A lease past ProbeUntil is free again, so a process that dies
	// while probing does not hold the backend half-open for good.
	ProbeOwner string    `json:"probe_owner,omitempty"`
	ProbeUntil time.Time `json:"probe_until,omitzero"`

	// Pacing: the freshest rate-limit report, and the requests let
	// through around and after its send (S is counted from Admits and
	// Dropped, by the rules on [Breaker]).
	Report    *SharedReport     `json:"report,omitempty"`     // nil until the first report
	ReportSeq uint64            `json:"report_seq,omitempty"` // the admission of the report's own request; 0 when not known
	Admits    []SharedAdmission `json:"admits,omitempty"`     // the admissions a report, present or to come, may count from, in order
	Dropped   int               `json:"dropped,omitempty"`    // admissions dropped from Admits that S still counts
	DroppedAt time.Time         `json:"dropped_at,omitzero"`  // when the last of them came back
	AdmitSeq  uint64            `json:"admit_seq,omitempty"`  // the last admission's number, across the fleet
	TokenUse  int64             `json:"token_use,omitempty"`  // tokens a request uses, as the reports' drop says; 0 until known
}

// SharedAdmission is one request a [Breaker] of the fleet let through.
type SharedAdmission struct {
	At   time.Time `json:"at"`             // when it was let through, no later than its send
	Seq  uint64    `json:"seq"`            // its number, from SharedState.AdmitSeq
	Done bool      `json:"done,omitempty"` // its outcome was observed
	Back time.Time `json:"back,omitzero"`  // when, with Done; with !Done, when it is taken as back if its process never says (a lease)
}

// SharedReport is a rate-limit report as a [Breaker] keeps it: what one
// response's headers said about the provider's buckets.
type SharedReport struct {
	Sent         time.Time    `json:"sent"`                   // when the request that drew it was sent
	Read         time.Time    `json:"read"`                   // when its header was read; resets count from it
	Requests     SharedBucket `json:"requests,omitzero"`      // the requests bucket
	Tokens       SharedBucket `json:"tokens,omitzero"`        // the tokens bucket
	InputTokens  SharedBucket `json:"input_tokens,omitzero"`  // Anthropic's input-tokens bucket
	OutputTokens SharedBucket `json:"output_tokens,omitzero"` // Anthropic's output-tokens bucket
	RetryAt      time.Time    `json:"retry_at,omitzero"`      // when Retry-After said to try again; zero when it did not
}

// SharedBucket is what one report said about one of the provider's
// buckets. Known is false when the report said nothing of it.
type SharedBucket struct {
	Known     bool          `json:"known,omitempty"`
	Limit     int64         `json:"limit,omitempty"`     // the bucket's size; 0 when not stated
	Remaining int64         `json:"remaining,omitempty"` // what it held when the provider answered
	Reset     time.Duration `json:"reset,omitempty"`     // until it is full again, from Read
	Next      time.Time     `json:"next,omitzero"`       // when the provider admits the next unit beyond Remaining
}

// DefaultStoreTimeout bounds each call a [Breaker] with a Store makes to
// it when its StoreTimeout is zero.
const DefaultStoreTimeout = 50 * time.Millisecond

// DefaultProbeLease is how long a probe (or any request let through) of a
// [Breaker] with a Store counts as in flight when its process never says
// how it went, when ProbeLease is zero.
const DefaultProbeLease = 2 * time.Minute
