package riverretry

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/riverqueue/river/rivertype"
)

// MetadataKey is the key of the job metadata that [Adapter] keeps: a
// JSON object that decodes into [Metadata]. River's own "snoozes" count
// is kept apart from it, because River counts every snooze, whoever asked
// for it, while the adapter's limit is on its own.
const MetadataKey = "llmretry"

// Metadata is what [Adapter] records about a job across its runs, under
// [MetadataKey] in the job's metadata. Read it with [JobMetadata]. River
// stores no error for a snoozed run or for one stopped by the client's
// shutdown, so this is where those runs leave a trace.
type Metadata struct {
	// Snoozes counts the runs snoozed on retry-after advice.
	Snoozes int `json:"snoozes"`
	// Cancellations counts the runs whose chain returned an
	// [*llmretry.Cancelled]: the client stopped (or the job was cancelled)
	// while the chain ran.
	Cancellations int `json:"cancellations"`
	// LastSnooze is the last snoozed run, nil before the first.
	LastSnooze *Snooze `json:"last_snooze,omitempty"`
}

// Snooze is the record of one snoozed run.
type Snooze struct {
	At      time.Time       // when the run was snoozed
	Attempt int             // the job's attempt number during the run; River does not count it
	For     time.Duration   // how long the job was snoozed for
	Error   json.RawMessage // the chain's JSON record of the run, as [Error] renders it
}

// snoozeJSON is Snooze on the wire: durations in milliseconds and
// snake_case keys, as the core's records have them.
type snoozeJSON struct {
	At      time.Time       `json:"at"`
	Attempt int             `json:"attempt"`
	ForMS   int64           `json:"for_ms"`
	Error   json.RawMessage `json:"error"`
}

// MarshalJSON encodes the record with keys at, attempt, for_ms and error.
func (s Snooze) MarshalJSON() ([]byte, error) {
	return json.Marshal(snoozeJSON{At: s.At, Attempt: s.Attempt, ForMS: s.For.Milliseconds(), Error: s.Error})
}

// UnmarshalJSON decodes a record written by [Snooze.MarshalJSON].
func (s *Snooze) UnmarshalJSON(data []byte) error {
	var j snoozeJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*s = Snooze{At: j.At, Attempt: j.Attempt, For: time.Duration(j.ForMS) * time.Millisecond, Error: j.Error}
	return nil
}

// JobMetadata returns the adapter's record in job's metadata: the zero
// Metadata when there is none yet, and an error when the metadata is not
// JSON or the value under [MetadataKey] is not a record.
func JobMetadata(job *rivertype.JobRow) (Metadata, error) {
	if job == nil || len(job.Metadata) == 0 {
		return Metadata{}, nil
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(job.Metadata, &all); err != nil {
		return Metadata{}, fmt.Errorf("riverretry: job %d: metadata: %v", job.ID, err)
	}
	raw, ok := all[MetadataKey]
	if !ok {
		return Metadata{}, nil
	}
	var md Metadata
	if err := json.Unmarshal(raw, &md); err != nil {
		return Metadata{}, fmt.Errorf("riverretry: job %d: metadata key %q: %v", job.ID, MetadataKey, err)
	}
	return md, nil
}
