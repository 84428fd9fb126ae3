package temporalretry

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// Runs is what an activity attempt knows of the attempts of the same
// activity before it. Temporal calls them attempts; this package calls
// them runs, as batch does, to keep them apart from a chain's attempts.
// A failure that [Do] or [ActivityError] returns carries it as its second
// detail, after the run's own record, so that a workflow sees what every
// run of an item sent, not only the last:
//
//	var record json.RawMessage
//	var runs temporalretry.Runs
//	err := appErr.Details(&record, &runs)
//
// It encodes as {"run", "earlier", "omitted"}. [DeadLetterOf] reads it.
type Runs struct {
	// Run is the number of the run that wrote it: the activity's attempt,
	// from 1.
	Run int `json:"run"`
	// Earlier holds the records of the runs before it, oldest first, each
	// the JSON record of the chain's error as the run ended (see
	// [ActivityError]), or, for a run that ended without a word (a
	// heartbeat timeout, a worker's death), the record its heartbeats
	// left. At most batch.KeptRuns-1 are kept, as a batch dead letter
	// keeps them: the first run's, then the latest. Never null.
	Earlier []json.RawMessage `json:"earlier"`
	// Omitted counts the earlier runs whose records are not in Earlier:
	// left out to bound its size, or lost because the run's heartbeats
	// never reached Temporal.
	Omitted int `json:"omitted"`
}

// EarlierRuns returns what the activity attempt whose context ctx is
// knows of the runs before it, from the heartbeat details that [Do]
// recorded in them: Run is this run's number, and Earlier and Omitted the
// runs before it. A run that succeeds after others failed can log or bill
// what they cost with it (each record's attempts carry their usage). It
// is what [ActivityError] puts in a failure's details. Outside an
// activity it returns the zero Runs.
func EarlierRuns(ctx context.Context) Runs {
	if ctx == nil || !activity.IsActivity(ctx) {
		return Runs{}
	}
	return resumeFrom(ctx, int(activity.GetInfo(ctx).Attempt)).runs
}

// then returns what the next run knows: r, with the record of run r.Run
// appended to Earlier, the oldest dropped past the bound.
func (r Runs) then(record json.RawMessage) Runs {
	next := Runs{Run: r.Run + 1, Omitted: r.Omitted}
	next.Earlier = append(make([]json.RawMessage, 0, len(r.Earlier)+1), r.Earlier...)
	next.Earlier = append(next.Earlier, record)
	if over := len(next.Earlier) - (batch.KeptRuns - 1); over > 0 {
		// Keep the first run's record, which shows how the trouble began,
		// and the latest ones, which show how it is going.
		next.Earlier = append(next.Earlier[:1], next.Earlier[1+over:]...)
		next.Omitted += over
	}
	return next
}

// ledgerVersion is the version of the heartbeat details' format. A run
// that reads details of another version, or none it can decode, starts
// from no records, as a first run does, and counts the runs before it as
// omitted.
const ledgerVersion = 1

// ledger is the heartbeat details that [Do] records: everything a later
// run needs to start where this one stopped, and what a workflow shows of
// a run that timed out. The format is private: [DeadLetterOf] and Do read
// it, and its version lets a newer worker read an older one's.
type ledger struct {
	V int `json:"v"`
	Runs
	// Record is the run's JSON record: once the run has ended (Ended),
	// the chain's record of its outcome; until then, the record of a
	// [llmretry.TimedOut] with the attempts so far and, when a request
	// is in flight, one more attempt for it (see lostAttempt): what the
	// run's record is if it ends now without a word.
	Record json.RawMessage `json:"record"`
	// Ended says that Record is the run's outcome, written as the run
	// returned its error.
	Ended bool `json:"ended"`
}

// errLost is the error of a request whose run ended without a word while
// it was in flight: a heartbeat timeout, a start-to-close timeout or the
// worker's death. Nobody saw its answer.
var errLost = errors.New("temporalretry: no answer seen: the activity attempt ended without a word (heartbeat timeout, start-to-close timeout or the worker's death) while this request was in flight")

// lostAttempt is the record of a request in flight: sent at start to
// backend (model, try), and not answered by now, as far as anyone knows.
// It says timeout, and that the run stopped there: should the run end
// now, this is how its last request ended.
func lostAttempt(s sending, now time.Time) llmretry.Attempt {
	return llmretry.Attempt{
		Backend: s.backend, Model: s.model, Try: s.try,
		Kind: llmretry.KindTimeout, Err: errLost,
		Start: s.start, Elapsed: now.Sub(s.start),
		Next: llmretry.NextStop, Why: llmretry.WhyDeadline,
	}
}

// sending is a request in flight: its backend, model, try and when it
// was sent.
type sending struct {
	backend int
	model   string
	try     int
	start   time.Time
}

// resume is where a run starts, as the heartbeat details of the runs
// before it say.
type resume struct {
	runs Runs
	// previous is the last earlier run's record, when its details were
	// read; nil otherwise.
	previous json.RawMessage
}

// resumeFrom reads the heartbeat details of the runs before this one, if
// any, for the run whose number is run.
func resumeFrom(ctx context.Context, run int) resume {
	fresh := resume{runs: Runs{Run: run, Earlier: []json.RawMessage{}, Omitted: run - 1}}
	if run <= 1 || !activity.HasHeartbeatDetails(ctx) {
		return fresh
	}
	var l ledger
	if err := activity.GetHeartbeatDetails(ctx, &l); err != nil || !l.valid(run) {
		return fresh // details of another format or version: start from nothing, as a first run does
	}
	runs := l.Runs.then(l.Record)
	// Runs between the one that wrote the details and this one left none:
	// they died before their first heartbeat reached Temporal.
	runs.Omitted += run - runs.Run
	runs.Run = run
	return resume{runs: runs, previous: l.Record}
}

// valid reports whether l is a ledger this version wrote, by a run before
// run.
func (l *ledger) valid(run int) bool {
	return l.V == ledgerVersion && l.Run >= 1 && l.Run < run && l.Omitted >= 0 &&
		json.Valid(l.Record) && len(l.Earlier) < batch.KeptRuns
}

// recorded is the part of a run's JSON record that a resuming run reads.
type recorded struct {
	Outcome       string             `json:"outcome"`
	ItemRetryable bool               `json:"item_retryable"`
	Attempts      []llmretry.Attempt `json:"attempts"`
}

// decodeRecord reads what a resuming run needs of a record; ok is false
// for one it cannot read, which then says nothing.
func decodeRecord(data json.RawMessage) (r recorded, ok bool) {
	if len(data) == 0 {
		return recorded{}, false
	}
	if err := json.Unmarshal(data, &r); err != nil || r.Outcome == "" {
		return recorded{}, false
	}
	return r, true
}
