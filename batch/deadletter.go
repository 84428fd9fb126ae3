package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/internal/jsontype"
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
// error text, attempts, the raw output in them redacted; see
// [llmretry.Exhausted]), and otherwise
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
// encoding or the writer's error. [ReadDeadLetters] reads the lines back.
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

// UnmarshalJSON reads back a dead letter that [DeadLetter.MarshalJSON]
// wrote. Each run's error comes back as follows: a record of one of the
// chain's four errors (it has their "outcome" key) as the typed error
// [llmretry.DecodeError] returns, with its records and advice, so that
// llmretry.RetryItem and llmretry.RetryItemAfter answer for it as they
// did when it was written; {"error": text} as a plain error carrying the
// text; null as nil; and whatever else an error's own MarshalJSON wrote
// as a plain error whose text is that JSON. Earlier is nil when the list
// is empty. Unknown keys are ignored; the "id" key is required. A failed
// decoding leaves d unchanged, and its error starts with
// "llmretry: batch: decoding dead letter: " and names the key at fault.
func (d *DeadLetter) UnmarshalJSON(data []byte) error {
	got, err := readDeadLetter(data)
	if err != nil {
		return fmt.Errorf("llmretry: batch: decoding dead letter: %s", err)
	}
	*d = got
	return nil
}

// ReadDeadLetters reads back the dead letters that [JSONLines] wrote to a
// file, one per line, in the file's order, each decoded as
// [DeadLetter.UnmarshalJSON] does (blank lines are skipped). It returns
// the dead letters read before any error, and the error, which starts
// with "llmretry: batch: reading dead letters: " and names the line (from
// 1) and what was wrong with it, or the reader's error. A line has no
// length limit: a dead letter holds every kept run's records.
func ReadDeadLetters(r io.Reader) ([]DeadLetter, error) {
	br := bufio.NewReader(r)
	var letters []DeadLetter
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return letters, fmt.Errorf("llmretry: batch: reading dead letters: line %d: %w", n, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			d, derr := readDeadLetter(line)
			if derr != nil {
				return letters, fmt.Errorf("llmretry: batch: reading dead letters: line %d: %s", n, derr)
			}
			letters = append(letters, d)
		}
		if err == io.EOF {
			return letters, nil
		}
	}
}

// readDeadLetter decodes one dead letter. Its errors name the key at
// fault, without the package's prefix.
func readDeadLetter(data []byte) (DeadLetter, error) {
	var d DeadLetter
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return d, fmt.Errorf("want an object, got %s", jsontype.Of(data))
		}
		return d, errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	if raw == nil {
		return d, errors.New("want an object, got null")
	}
	id, ok := raw["id"]
	if !ok || jsontype.IsNull(id) {
		return d, errors.New(`no "id" key`)
	}
	if d.ID, ok = jsonString(id); !ok {
		return d, fmt.Errorf(`field "id": want a string, got %s`, jsontype.Of(id))
	}
	if v, ok := raw["why"]; ok && !jsontype.IsNull(v) {
		why, ok := jsonString(v)
		if !ok {
			return d, fmt.Errorf(`field "why": want a string, got %s`, jsontype.Of(v))
		}
		d.Why = Why(why)
	}
	var err error
	if d.Runs, err = readCount(raw, "runs"); err != nil {
		return d, err
	}
	if d.Omitted, err = readCount(raw, "omitted"); err != nil {
		return d, err
	}
	if d.Err, err = readRunError(raw["error"]); err != nil {
		return d, fmt.Errorf(`field "error": %s`, err)
	}
	if v, ok := raw["earlier"]; ok && !jsontype.IsNull(v) {
		var list []json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil {
			return d, fmt.Errorf(`field "earlier": want an array, got %s`, jsontype.Of(v))
		}
		for i, e := range list {
			runErr, err := readRunError(e)
			if err != nil {
				return d, fmt.Errorf(`field "earlier"[%d]: %s`, i, err)
			}
			d.Earlier = append(d.Earlier, runErr)
		}
	}
	return d, nil
}

// readCount reads the non-negative integer under key; 0 when absent.
func readCount(raw map[string]json.RawMessage, key string) (int, error) {
	v, ok := raw[key]
	if !ok || jsontype.IsNull(v) {
		return 0, nil
	}
	if t := jsontype.Of(v); t != "number" {
		return 0, fmt.Errorf("field %q: want a number, got %s", key, t)
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("field %q: want a count, got %.40s", key, v)
	}
	return n, nil
}

// readRunError reads one run's error as errorJSON wrote it; absent or
// null is nil.
func readRunError(v json.RawMessage) (error, error) {
	if v == nil || jsontype.IsNull(v) {
		return nil, nil
	}
	if jsontype.Of(v) == "object" {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(v, &fields); err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "json: "))
		}
		if outcome, ok := jsonString(fields["outcome"]); ok && chainOutcome(outcome) {
			err, derr := llmretry.DecodeError(v)
			if derr != nil {
				return nil, errors.New(strings.TrimPrefix(derr.Error(), "llmretry: "))
			}
			return err, nil
		}
		if text, ok := jsonString(fields["error"]); ok {
			return errors.New(text), nil
		}
	}
	// An error of some other type, whose own MarshalJSON wrote this: its
	// text is the JSON, so nothing is lost.
	var compact bytes.Buffer
	if err := json.Compact(&compact, v); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	// Its bytes as encoding/json writes a string back: invalid UTF-8
	// as U+FFFD, so that a letter read, written and read again is the
	// same.
	return errors.New(strings.ToValidUTF8(compact.String(), "\uFFFD")), nil
}

// jsonString returns the string v holds, and false when v is not a JSON
// string.
func jsonString(v json.RawMessage) (string, bool) {
	var s string
	if jsontype.Of(v) != "string" || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// chainOutcome reports whether outcome is that of one of the chain's
// four errors, as their JSON records name it.
func chainOutcome(outcome string) bool {
	switch outcome {
	case "exhausted", "truncated", "timed_out", "cancelled":
		return true
	}
	return false
}
