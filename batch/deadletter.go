package batch

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/llmretry/llmretry"
)

// Why says why an item is dead, as its [DeadLetter] records it.
type Why string

const (
	// WhyNotRetryable: the last run's error advised against running the
	// item again ([llmretry.RetryItem] false), so it was not run again,
	// whatever runs it had left.
	WhyNotRetryable Why = "not_retryable"
	// WhyRunsUsed: the item had all of the runner's Runs, and the last one
	// failed too.
	WhyRunsUsed Why = "runs_used"
)

// KeptRuns is the most runs whose errors a dead letter keeps: the first
// run's, which shows how the trouble began, and the latest ones, which
// show how it ended. Each error holds the chain's attempts, raw output
// included, so an item run many times must not carry them all, into
// memory while it waits between runs nor into the dead letters.
const KeptRuns = 5

// DeadLetter is the record of an item that failed for good: its ID, why
// it is dead, the number of runs it had, and the error of each run (at
// most [KeptRuns] of them). It holds no request, which may be large or
// private; the ID finds it. [ReadDeadLetters] reads back what
// [JSONLines] wrote.
type DeadLetter struct {
	ID  string
	Why Why
	// Runs counts the runs that sent a request. A run in which the chain
	// skipped every backend for its breaker sent nothing: it is neither
	// counted nor kept (see Runner.Runs).
	Runs int
	Err  error // the last run's error, as the chain returned it
	// Earlier holds the errors of the runs before the last, oldest first:
	// all of them when Runs is at most KeptRuns; otherwise the first
	// run's, then those of the KeptRuns-2 runs just before the last, and
	// Omitted counts the runs between them that were left out. Earlier is
	// empty after one run.
	Earlier []error
	Omitted int
}

// MarshalJSON encodes the dead letter as one JSON object:
//
//	{"id": ..., "why": ..., "runs": ..., "error": ..., "earlier": [...], "omitted": ...}
//
// where "error" is the last run's error and "earlier" holds those of the
// runs before it that were kept (always a list, never null), each encoded
// the same way: json.Marshal(err) when err implements json.Marshaler, as
// the chain's four error types do (their record: outcome, item_retryable,
// error text, attempts; see [llmretry.Exhausted]), and otherwise
// {"error": text}, with text the redacted Error ([llmretry.Redact]), so
// that .error.error is the error's text whatever its type. A nil error
// encodes as null.
func (d DeadLetter) MarshalJSON() ([]byte, error) {
	last, err := errorJSON(d.Err)
	if err != nil {
		return nil, err
	}
	earlier := make([]json.RawMessage, len(d.Earlier))
	for i, e := range d.Earlier {
		if earlier[i], err = errorJSON(e); err != nil {
			return nil, err
		}
	}
	return json.Marshal(struct {
		ID      string            `json:"id"`
		Why     Why               `json:"why"`
		Runs    int               `json:"runs"`
		Error   json.RawMessage   `json:"error"`
		Earlier []json.RawMessage `json:"earlier"`
		Omitted int               `json:"omitted"`
	}{d.ID, d.Why, d.Runs, last, earlier, d.Omitted})
}

// errorJSON is the record of one run's error in a dead letter.
func errorJSON(err error) (json.RawMessage, error) {
	switch err := err.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case json.Marshaler:
		return json.Marshal(err)
	}
	return json.Marshal(struct {
		Error string `json:"error"`
	}{llmretry.Redact(err.Error())})
}

// Sink receives dead letters. Put stores one and returns an error when it
// could not; a [Runner] then stops (see Runner.Dead). A Runner calls Put
// from one goroutine at a time, across all of its concurrent Runs.
type Sink interface {
	Put(DeadLetter) error
}

// SinkFunc adapts a function to a [Sink]: SinkFunc(f).Put(d) calls f(d).
type SinkFunc func(DeadLetter) error

// Put calls f(d).
func (f SinkFunc) Put(d DeadLetter) error { return f(d) }

// JSONLines returns a Sink that writes each dead letter to w as one line
// of JSON (see [DeadLetter.MarshalJSON]), in a single Write call. It is
// safe for concurrent use: lines never interleave. Put's error wraps the
// encoding or the writer's error.
func JSONLines(w io.Writer) Sink { return &jsonLines{w: w} }

type jsonLines struct {
	mu sync.Mutex // one Write at a time, so lines stay whole
	w  io.Writer
}

func (j *jsonLines) Put(d DeadLetter) error {
	line, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("llmretry: batch: encoding dead letter of item %q: %w", d.ID, err)
	}
	line = append(line, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(line); err != nil {
		return fmt.Errorf("llmretry: batch: writing dead letter of item %q: %w", d.ID, err)
	}
	return nil
}
