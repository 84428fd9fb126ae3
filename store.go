package llmretry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// BreakerStore keeps the state that the Breakers of several processes
// share, one state per key, as opaque bytes with a version, and changes
// it atomically. It holds no rules and reads nothing of the bytes: a
// [Breaker] loads the state, decides with its own rules, and writes the
// result back with CompareAndSwap, deciding again when another process
// changed the state in between. The bytes carry their own format
// version: a Breaker that finds a newer format than it knows decides
// from its own state, as when the store fails, so a fleet in the middle
// of an upgrade stays safe, if not shared.
//
// A store must be safe for concurrent use. Every method is called with a
// context that the Breaker bounds by its StoreTimeout and by the
// deadline of the calls the decision is for; a method should return
// promptly, with an error, when the context is done. An error (or a
// timeout) never fails a call: the Breaker decides from its own state
// for that call, and writes what it decided with its next write.
//
// What a decision costs: one process makes the decisions of all its
// calls on a key that are due at the same time together (one load and
// one compare-and-swap for all of them), it loads only when another
// process may have changed the state since it last read or wrote it (a
// Watch tells it), a decision that changes nothing writes nothing, and a
// waiting call is woken in its turn rather than on every change. So a
// request through a closed breaker costs at most four store calls, and
// usually fewer; a call that waits in line costs a load more each time
// its turn can have come. A [StateNotifier] saves most loads.
//
// On PostgreSQL a store is one row per key: the key, a version column and
// the state (bytea); CompareAndSwap is an UPDATE (or, at version 0, an
// INSERT … ON CONFLICT DO NOTHING) that matches on the version, and
// Watch is a LISTEN on a channel that CompareAndSwap NOTIFYs.
// llmretrytest.MemoryStore keeps them in memory, for tests, and has a
// conformance test any store can reuse.
type BreakerStore interface {
	// Load returns the state stored for key and its version. A key never
	// written is not an error: Load returns nil and version 0.
	Load(ctx context.Context, key string) (state []byte, version int64, err error)

	// CompareAndSwap stores next for key when the stored version is
	// still version (0: nothing stored yet), and then the stored version
	// becomes version+1. It returns false, with a nil error, when the
	// stored version is another: someone changed the state since it was
	// loaded, and nothing was written. It must not keep next, which the
	// Breaker may reuse, beyond the call.
	CompareAndSwap(ctx context.Context, key string, version int64, next []byte) (ok bool, err error)

	// Watch returns a channel that receives a value soon after the state
	// of key changes (a change this process made may be sent too), until
	// ctx is done; then the store closes it. The channel may drop values
	// when the receiver is slow: a value means "load again", not which
	// change. A nil channel with a nil error means the store cannot
	// watch, and the Breaker polls instead.
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

// StateNotifier is a BreakerStore whose notices of a change carry the
// state they announce. A Breaker on one decides on the newest noticed
// state, without a store call, and loads only when the notices cannot
// say what the state is; pgbreaker's store and llmretrytest.MemoryStore
// are StateNotifiers. A store that wraps one must pass Noticed through,
// or its Breakers load before each decision.
type StateNotifier interface {
	BreakerStore
	// Noticed returns the state of key that the newest notice of a
	// change carried, and its version. The notices must tell of every
	// change of key since the store's first call with key, whether or
	// not a Watch of key runs: ok is false when one may have gone
	// unheard (a connection lost), when none came yet, and when the
	// newest carried no state. The state must be in place before the
	// notice's value is sent on a Watch channel. Noticed does not call
	// the store and does not block; the caller does not modify the
	// bytes.
	Noticed(key string) (state []byte, version int64, ok bool)
}

// DefaultStoreTimeout bounds the store calls of one decision of a
// [Breaker] with a Store when its StoreTimeout is zero: long enough for a
// database across a region's network, short enough that a call is never
// held up long by one that hangs.
const DefaultStoreTimeout = 100 * time.Millisecond

// DefaultProbeLease is how long a probe, any other request let through,
// or a waiting call's place in line, of a [Breaker] with a Store, holds
// after its process last wrote the state (every write renews it), when
// ProbeLease is zero. A process with requests still in flight writes a
// quarter of the lease before it runs out, though it has nothing else to
// write, so that a stream longer than the lease is not taken as back; a
// process that dies is taken for dead once its lease has run out.
const DefaultProbeLease = 2 * time.Minute

// sharedFormat is the format of the state this version of the package
// writes, the first field of its bytes. Format 1 was a JSON document
// that stores kept as their own structs; 2 is this package's own.
const sharedFormat = 2

// shared is the state a fleet of Breakers keeps in their store: what
// every process must agree on about one backend. Times are wall-clock
// times of the processes that wrote them: a fleet sharing a store must
// keep its clocks in step (NTP keeps them within milliseconds, far less
// than any cooldown or pacing interval). Its encoding is private to this
// package: stores keep it as bytes.
type shared struct {
	Format int `json:"v"`

	Fails      int       `json:"fails,omitempty"`
	Until      time.Time `json:"until,omitzero"`
	Kind       Kind      `json:"kind,omitempty"`
	Hinted     bool      `json:"hinted,omitempty"`
	Opened     int       `json:"opened,omitempty"`
	ProbeOwner string    `json:"probe,omitempty"`      // the process that holds the half-open probe, and the probe's number
	ProbeUntil time.Time `json:"probe_until,omitzero"` // when its lease runs out

	Report     *sharedReport `json:"report,omitempty"`
	ReportSeq  uint64        `json:"report_seq,omitempty"`
	ReportBase uint64        `json:"report_base,omitempty"`
	Admitted   uint64        `json:"admitted,omitempty"`
	Back       uint64        `json:"back,omitempty"`
	Recent     []time.Time   `json:"recent,omitempty"`
	Folded     int           `json:"folded,omitempty"`
	FoldedAt   time.Time     `json:"folded_at,omitzero"`
	TokenUse   int64         `json:"token_use,omitempty"`
	Est        costs         `json:"est,omitzero"`        // the estimates of the requests let through
	EstBack    costs         `json:"est_back,omitzero"`   // of those back
	ReportEst  costs         `json:"report_est,omitzero"` // EstBack when the report's request was let through
	ReportOwn  costs         `json:"report_own,omitzero"` // the report's request's own estimate
	Over       costs         `json:"over,omitzero"`       // what the requests back were estimated beyond what they used
	ReportOver costs         `json:"report_over,omitzero"`
	OwnOver    costs         `json:"own_over,omitzero"`

	Gate  time.Time   `json:"gate,omitzero"` // no call of the fleet's line goes before it
	Procs []procEntry `json:"procs,omitempty"`
}

// procEntry is one process's part of the shared state: its requests in
// flight, and its line, summed up by its first call. Every write of the
// process renews its lease; an entry whose lease has run out is of a
// process that died: its requests are taken as back, their estimates
// with them, and its line as gone.
type procEntry struct {
	ID       string    `json:"id"`
	Lease    time.Time `json:"lease"`
	InFlight int64     `json:"in_flight,omitempty"` // requests it let through whose outcome it has not written
	Est      costs     `json:"est,omitzero"`        // their estimates
	Wseq     uint64    `json:"wseq,omitempty"`      // its writes so far: a write whose answer was lost shows here if it landed
	Head     time.Time `json:"head,omitzero"`       // when the first call of its line began; zero when none waits
	Waiting  int       `json:"waiting,omitempty"`   // the calls of its line
}

// sharedReport is a limitReport as the state keeps it.
type sharedReport struct {
	Sent         time.Time    `json:"sent"`
	Read         time.Time    `json:"read"`
	Requests     sharedBucket `json:"requests,omitzero"`
	Tokens       sharedBucket `json:"tokens,omitzero"`
	InputTokens  sharedBucket `json:"input_tokens,omitzero"`
	OutputTokens sharedBucket `json:"output_tokens,omitzero"`
	RetryAt      time.Time    `json:"retry_at,omitzero"`
}

// sharedBucket is a bucketReading as the state keeps it.
type sharedBucket struct {
	Known     bool          `json:"known,omitempty"`
	Limit     int64         `json:"limit,omitempty"`
	Remaining int64         `json:"remaining,omitempty"`
	Reset     time.Duration `json:"reset,omitempty"`
	Next      time.Time     `json:"next,omitzero"`
}

// errNewerFormat is the store error of a state this package cannot read.
var errNewerFormat = errors.New("llmretry: breaker store: state of a newer format")

// decodeShared reads a state from its bytes; nil bytes are the zero
// state, a breaker that has seen nothing.
func decodeShared(data []byte) (shared, error) {
	var st shared
	if len(data) == 0 {
		return st, nil
	}
	var head struct {
		Format int `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.Format == 0 {
		return st, fmt.Errorf("llmretry: breaker store: state is not one this package wrote (%d bytes)", len(data))
	}
	if head.Format > sharedFormat {
		return st, fmt.Errorf("%w: format %d, this package reads up to %d", errNewerFormat, head.Format, sharedFormat)
	}
	if head.Format < sharedFormat {
		// An older package's state: start afresh, as from nothing
		// stored; the fleet relearns it from the next answers.
		return st, nil
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return shared{}, fmt.Errorf("llmretry: breaker store: decoding the state: %v", err)
	}
	return st, nil
}

// encodeShared writes a state as its bytes.
func encodeShared(st *shared) []byte {
	st.Format = sharedFormat
	data, err := json.Marshal(st)
	if err != nil {
		// Only times outside years 0 to 9999 fail to encode, and no
		// reading of a clock gives one.
		panic("llmretry: encoding breaker state: " + err.Error())
	}
	return data
}

func toSharedReport(r limitReport) *sharedReport {
	return &sharedReport{
		Sent: r.sent, Read: r.read, RetryAt: r.retryAt,
		Requests: toSharedBucket(r.requests), Tokens: toSharedBucket(r.tokens),
		InputTokens: toSharedBucket(r.inputTokens), OutputTokens: toSharedBucket(r.outputTokens),
	}
}

func (r *sharedReport) limitReport() limitReport {
	return limitReport{
		sent: r.Sent, read: r.Read, retryAt: r.RetryAt,
		requests: r.Requests.reading(), tokens: r.Tokens.reading(),
		inputTokens: r.InputTokens.reading(), outputTokens: r.OutputTokens.reading(),
	}
}

func toSharedBucket(k bucketReading) sharedBucket {
	return sharedBucket{Known: k.known, Limit: k.limit, Remaining: k.remaining, Reset: k.reset, Next: k.next}
}

func (k sharedBucket) reading() bucketReading {
	return bucketReading{known: k.Known, limit: k.Limit, remaining: k.Remaining, reset: k.Reset, next: k.Next}
}
