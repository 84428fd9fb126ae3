package batch

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/llmretry/llmretry"
)

// DeadLetter is the record of an item that failed for good: its ID, the
// number of runs it had, and the error of the last one. It holds no
// request, which may be large or private; the ID finds it.
type DeadLetter struct {
	ID   string
	Runs int
	Err  error // the last run's error, as the chain returned it
}

// MarshalJSON encodes the dead letter as one JSON object:
//
//	{"id": ..., "runs": ..., "error": ...}
//
// where "error" is json.Marshal(Err) when Err implements json.Marshaler,
// as the chain's four error types do (their record: outcome,
// item_retryable, error text, attempts; see [llmretry.Exhausted]), and
// otherwise {"error": text}, with text the redacted Error ([llmretry.Redact]),
// so that .error.error is the error's text whatever its type. A nil Err
// encodes as null.
func (d DeadLetter) MarshalJSON() ([]byte, error) {
	var record json.RawMessage
	switch err := d.Err.(type) {
	case nil:
		record = json.RawMessage("null")
	case json.Marshaler:
		b, mErr := json.Marshal(err)
		if mErr != nil {
			return nil, mErr
		}
		record = b
	default:
		b, mErr := json.Marshal(struct {
			Error string `json:"error"`
		}{llmretry.Redact(err.Error())})
		if mErr != nil {
			return nil, mErr
		}
		record = b
	}
	return json.Marshal(struct {
		ID    string          `json:"id"`
		Runs  int             `json:"runs"`
		Error json.RawMessage `json:"error"`
	}{d.ID, d.Runs, record})
}

// Sink receives dead letters. Put stores one and returns an error when it
// could not; a [Runner] then stops (see Runner.Dead). A Runner calls Put
// from one goroutine at a time.
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
