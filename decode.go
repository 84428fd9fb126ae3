package llmretry

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmretry/llmretry/internal/jsontype"
)

// DecodeError reads back the record that json.Marshal wrote for one of the
// chain's errors (see [Exhausted.MarshalJSON]): from its "outcome" key it
// returns a [*Exhausted] ("exhausted"), [*Truncated] ("truncated"),
// [*TimedOut] ("timed_out") or [*Cancelled] ("cancelled"), holding the
// records of "attempts" as [Attempt.UnmarshalJSON] decodes them (each
// Err a plain error carrying the recorded, redacted text) and, for a
// TimedOut or Cancelled, a Cause carrying the text of "cause" (nil when
// the key is absent). A dead-letter table, a job queue's error column
// or a batch's dead letters can so be routed again: [RetryItem] and
// [RetryItemAfter] answer for the decoded error as they did for the
// original, since both are computed from the records.
//
// The keys derived from the records ("item_retryable", "error", "usage"
// and "usage_unknown") are not read: the decoded error computes them,
// by this version's rules. Unknown keys are ignored, and JSON null
// decodes to a nil error, as json.Marshal writes a nil error. The first
// error is the decoded one; the second, when the data is not such a
// record, starts with "llmretry: decoding error record: " and names what
// was wrong (a key, an attempt by its index), and the first is then nil.
func DecodeError(data []byte) (error, error) {
	if jsontype.IsNull(data) {
		return nil, nil
	}
	rec, err := readErrorRecord(data)
	if err != nil {
		return nil, decodeErr(err)
	}
	switch rec.outcome {
	case "exhausted":
		return &Exhausted{Attempts: rec.attempts}, nil
	case "truncated":
		return &Truncated{Exhausted{Attempts: rec.attempts}}, nil
	case "timed_out":
		return &TimedOut{Exhausted: Exhausted{Attempts: rec.attempts}, Cause: rec.cause}, nil
	}
	return &Cancelled{Attempts: rec.attempts, Cause: rec.cause}, nil
}

// UnmarshalJSON reads back what [Exhausted.MarshalJSON] wrote, as
// [DecodeError] does; it refuses a record of another outcome. JSON null
// leaves e unchanged, and so does a failed decoding.
func (e *Exhausted) UnmarshalJSON(data []byte) error {
	return unmarshalRecord(data, "exhausted", func(rec errorRecord) { *e = Exhausted{Attempts: rec.attempts} })
}

// UnmarshalJSON reads back what [Truncated.MarshalJSON] wrote, as
// [DecodeError] does; it refuses a record of another outcome. JSON null
// leaves e unchanged, and so does a failed decoding.
func (e *Truncated) UnmarshalJSON(data []byte) error {
	return unmarshalRecord(data, "truncated", func(rec errorRecord) { *e = Truncated{Exhausted{Attempts: rec.attempts}} })
}

// UnmarshalJSON reads back what [TimedOut.MarshalJSON] wrote, as
// [DecodeError] does; it refuses a record of another outcome. JSON null
// leaves e unchanged, and so does a failed decoding.
func (e *TimedOut) UnmarshalJSON(data []byte) error {
	return unmarshalRecord(data, "timed_out", func(rec errorRecord) {
		*e = TimedOut{Exhausted: Exhausted{Attempts: rec.attempts}, Cause: rec.cause}
	})
}

// UnmarshalJSON reads back what [Cancelled.MarshalJSON] wrote, as
// [DecodeError] does; it refuses a record of another outcome. JSON null
// leaves c unchanged, and so does a failed decoding.
func (c *Cancelled) UnmarshalJSON(data []byte) error {
	return unmarshalRecord(data, "cancelled", func(rec errorRecord) { *c = Cancelled{Attempts: rec.attempts, Cause: rec.cause} })
}

// unmarshalRecord decodes data as the record of outcome and hands it to
// set; null sets nothing.
func unmarshalRecord(data []byte, outcome string, set func(errorRecord)) error {
	if jsontype.IsNull(data) {
		return nil
	}
	rec, err := readErrorRecord(data)
	if err != nil {
		return decodeErr(err)
	}
	if rec.outcome != outcome {
		return decodeErr(fmt.Errorf("outcome %q, want %q (DecodeError reads any outcome)", rec.outcome, outcome))
	}
	set(rec)
	return nil
}

// errorRecord is what an error's record holds that its error keeps.
type errorRecord struct {
	outcome  string
	attempts []Attempt // nil when there are none
	cause    error     // nil when the record has no cause
}

// outcomes are the values of an error record's "outcome" key.
var outcomes = map[string]bool{"exhausted": true, "truncated": true, "timed_out": true, "cancelled": true}

// readErrorRecord parses an error's record. Its errors name the key or
// attempt at fault, without the package's prefix.
func readErrorRecord(data []byte) (errorRecord, error) {
	var rec errorRecord
	if t := jsontype.Of(data); t != "object" {
		if err := json.Unmarshal(data, new(any)); err != nil {
			return rec, errors.New(strings.TrimPrefix(err.Error(), "json: "))
		}
		return rec, fmt.Errorf("want an object, got %s", t)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return rec, errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	v, ok := raw["outcome"]
	if !ok || jsontype.IsNull(v) {
		return rec, errors.New(`no "outcome" key`)
	}
	s, err := readString(v)
	if err != nil {
		return rec, fmt.Errorf(`field "outcome": %s`, err)
	}
	if !outcomes[s] {
		return rec, fmt.Errorf("unknown outcome %s", shown(v))
	}
	rec.outcome = s
	if v, ok := raw["attempts"]; ok && !jsontype.IsNull(v) {
		if t := jsontype.Of(v); t != "array" {
			return rec, fmt.Errorf(`field "attempts": want an array, got %s`, t)
		}
		var list []json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil {
			return rec, fmt.Errorf(`field "attempts": %s`, strings.TrimPrefix(err.Error(), "json: ")) // not reached: the object parsed
		}
		for i, item := range list {
			if t := jsontype.Of(item); t != "object" {
				return rec, fmt.Errorf("attempts[%d]: want an object, got %s", i, t)
			}
			var a Attempt
			if err := a.UnmarshalJSON(item); err != nil {
				return rec, fmt.Errorf("attempts[%d]: %s", i, strings.TrimPrefix(err.Error(), "llmretry: decoding attempt: "))
			}
			rec.attempts = append(rec.attempts, a)
		}
	}
	// Only a TimedOut and a Cancelled write a cause; the key is ignored
	// on the others, as any other key they do not write.
	if v, ok := raw["cause"]; ok && !jsontype.IsNull(v) && (rec.outcome == "timed_out" || rec.outcome == "cancelled") {
		s, err := readString(v)
		if err != nil {
			return rec, fmt.Errorf(`field "cause": %s`, err)
		}
		if s != "" {
			// An empty cause is none: the JSON leaves out a cause it has
			// no text for, and reads the same twice.
			rec.cause = errors.New(s)
		}
	}
	return rec, nil
}

// decodeErr is the error of a record that does not decode.
func decodeErr(err error) error {
	return fmt.Errorf("llmretry: decoding error record: %s", err)
}
