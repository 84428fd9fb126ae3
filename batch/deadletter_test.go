package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// line is how a reader of the dead letters decodes one.
type line struct {
	ID      string      `json:"id"`
	Why     string      `json:"why"`
	Runs    int         `json:"runs"`
	Error   runRecord   `json:"error"`
	Earlier []runRecord `json:"earlier"`
	Omitted int         `json:"omitted"`
}

// runRecord is the chain's record of one run's error.
type runRecord struct {
	Outcome       string             `json:"outcome"`
	ItemRetryable bool               `json:"item_retryable"`
	Error         string             `json:"error"`
	Usage         *llmretry.Usage    `json:"usage,omitempty"`
	UsageUnknown  int                `json:"usage_unknown"`
	Attempts      []llmretry.Attempt `json:"attempts"`
}

// recordOf is what a reader should find for err, one of the chain's
// errors of the given outcome.
func recordOf(t *testing.T, err error, outcome string) runRecord {
	t.Helper()
	var ex *llmretry.Exhausted
	if !errors.As(err, &ex) {
		t.Fatalf("Err = %T, want an *Exhausted", err)
	}
	total, unknown := llmretry.TotalUsage(ex.Attempts)
	rec := runRecord{Outcome: outcome, ItemRetryable: llmretry.RetryItem(err), Error: err.Error(), UsageUnknown: unknown, Attempts: ex.Attempts}
	for _, a := range ex.Attempts {
		if a.Usage != nil {
			rec.Usage = &total
			break
		}
	}
	return rec
}

// sameText compares errors by their text: a decoded attempt's error is a
// plain error with the original's (redacted) message.
var sameText = cmp.Comparer(func(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return llmretry.Redact(a.Error()) == llmretry.Redact(b.Error())
})

// The runner's dead letters, written by JSONLines and decoded back, hold
// the item's ID, why it is dead, its runs and the chain's record of every
// run.
func TestJSONLinesRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(time.Second, map[string][]error{"cut": {cut}, "busy": {overloaded}})
		var rec record
		r := rec.runner(f.chain())
		r.Concurrency = 1 // so the lines come in the items' order
		r.Waits = []time.Duration{time.Second}
		var buf bytes.Buffer
		sink := batch.JSONLines(&buf)
		var letters []batch.DeadLetter
		r.Dead = batch.SinkFunc(func(d batch.DeadLetter) error {
			letters = append(letters, d)
			return sink.Put(d)
		})
		if _, err := r.Run(context.Background(), items("cut", "ok", "busy")); err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}

		var want []line
		for _, d := range letters {
			outcome := map[string]string{"cut": "truncated", "busy": "exhausted"}[d.ID]
			l := line{ID: d.ID, Why: string(d.Why), Runs: d.Runs, Error: recordOf(t, d.Err, outcome), Omitted: d.Omitted}
			l.Earlier = []runRecord{}
			for _, e := range d.Earlier {
				l.Earlier = append(l.Earlier, recordOf(t, e, outcome))
			}
			want = append(want, l)
		}
		if len(want) != 2 || want[0].ID != "cut" || want[0].Runs != 1 || want[0].Why != "not_retryable" || len(want[0].Earlier) != 0 ||
			want[1].ID != "busy" || want[1].Runs != 3 || want[1].Why != "runs_used" || len(want[1].Earlier) != 2 {
			t.Fatalf("dead letters %+v, want cut after 1 run, not retryable, and busy after 3 runs used, with the 2 before", letters)
		}

		var got []line
		for _, text := range strings.SplitAfter(buf.String(), "\n") {
			if text == "" {
				continue
			}
			if !strings.HasSuffix(text, "\n") || strings.Count(text, "\n") != 1 {
				t.Errorf("line %q: want one line ending in a newline", text)
			}
			var l line
			dec := json.NewDecoder(strings.NewReader(text))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&l); err != nil {
				t.Fatalf("decoding %q: %v", text, err)
			}
			got = append(got, l)
		}
		if diff := cmp.Diff(want, got, sameText); diff != "" {
			t.Errorf("dead letters (-want +got):\n%s", diff)
		}
	})
}

// A dead letter says why the item is dead and keeps each run's error,
// the first run's and the latest ones' when there were more than
// KeptRuns, with a count of those left out.
func TestDeadLetterRuns(t *testing.T) {
	// fail[i] is run i+1's failure, so that each run's error can be told
	// apart in the records.
	var fail []error
	for i := range 10 {
		fail = append(fail, llmretry.StatusFailure(503, nil, fmt.Errorf("overloaded, run %d", i+1)))
	}
	tests := []struct {
		name        string
		runs        int
		script      []error
		wantWhy     batch.Why
		wantRuns    int
		wantLast    error
		wantEarlier []error // the attempt's error of each earlier run kept
		wantOmitted int
	}{
		{name: "one_run", runs: 1, script: fail, wantWhy: batch.WhyRunsUsed, wantRuns: 1, wantLast: fail[0]},
		{name: "runs_used", runs: 3, script: fail, wantWhy: batch.WhyRunsUsed, wantRuns: 3, wantLast: fail[2], wantEarlier: fail[:2]},
		{name: "not_retryable", runs: 3, script: []error{fail[0], refused}, wantWhy: batch.WhyNotRetryable, wantRuns: 2, wantLast: refused, wantEarlier: fail[:1]},
		{name: "not_retryable_first", runs: 3, script: []error{cut}, wantWhy: batch.WhyNotRetryable, wantRuns: 1, wantLast: cut},
		{name: "all_kept", runs: batch.KeptRuns, script: fail, wantWhy: batch.WhyRunsUsed, wantRuns: 5, wantLast: fail[4], wantEarlier: fail[:4]},
		{name: "one_left_out", runs: 6, script: fail, wantWhy: batch.WhyRunsUsed, wantRuns: 6, wantLast: fail[5],
			wantEarlier: []error{fail[0], fail[2], fail[3], fail[4]}, wantOmitted: 1},
		{name: "first_and_latest", runs: 10, script: fail, wantWhy: batch.WhyRunsUsed, wantRuns: 10, wantLast: fail[9],
			wantEarlier: []error{fail[0], fail[6], fail[7], fail[8]}, wantOmitted: 5},
	}
	// attemptErr is the error the backend gave in a run: the chain's
	// record of its one attempt holds it.
	attemptErr := func(t *testing.T, err error) error {
		t.Helper()
		var ex *llmretry.Exhausted
		if !errors.As(err, &ex) || len(ex.Attempts) != 1 {
			t.Fatalf("run error %v (%T), want an *Exhausted with 1 attempt", err, err)
		}
		return ex.Attempts[0].Err
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				f := newFake(0, map[string][]error{"x": tc.script})
				var rec record
				r := rec.runner(f.chain())
				r.Runs = tc.runs
				r.Waits = []time.Duration{time.Second}
				if _, err := r.Run(context.Background(), items("x")); err != nil {
					t.Fatalf("Run() error = %v, want nil", err)
				}
				d, ok := rec.dead["x"]
				if !ok {
					t.Fatalf("no dead letter for x")
				}
				if d.Why != tc.wantWhy || d.Runs != tc.wantRuns || d.Omitted != tc.wantOmitted {
					t.Errorf("dead letter Why, Runs, Omitted = %q, %d, %d, want %q, %d, %d", d.Why, d.Runs, d.Omitted, tc.wantWhy, tc.wantRuns, tc.wantOmitted)
				}
				if got := attemptErr(t, d.Err); got != tc.wantLast {
					t.Errorf("last run's attempt error = %v, want %v", got, tc.wantLast)
				}
				var got []error
				for _, e := range d.Earlier {
					got = append(got, attemptErr(t, e))
				}
				if diff := cmp.Diff(tc.wantEarlier, got, cmpopts.EquateErrors()); diff != "" {
					t.Errorf("earlier runs' attempt errors (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// plainErr is an error that is not the chain's and has fields json would
// otherwise show.
type plainErr struct{ Path string }

func (e *plainErr) Error() string { return "open " + e.Path + ": disk full" }

// An error that is not the chain's encodes as {"error": its redacted
// text}, and a nil one as null; the earlier runs' errors encode as the
// last one does, and earlier is a list even when empty.
func TestDeadLetterJSON(t *testing.T) {
	tests := []struct {
		name string
		d    batch.DeadLetter
		want string
	}{
		{"plain", batch.DeadLetter{ID: "a", Why: batch.WhyRunsUsed, Runs: 1, Err: errors.New("disk full")},
			`{"id":"a","why":"runs_used","runs":1,"error":{"error":"disk full"},"earlier":[],"omitted":0}`},
		{"struct_error", batch.DeadLetter{ID: "b", Why: batch.WhyRunsUsed, Runs: 1, Err: &plainErr{Path: "/tmp/x"}},
			`{"id":"b","why":"runs_used","runs":1,"error":{"error":"open /tmp/x: disk full"},"earlier":[],"omitted":0}`},
		{"redacted", batch.DeadLetter{ID: "c", Why: batch.WhyNotRetryable, Runs: 1, Err: errors.New("refused: Authorization: Bearer sk-abcdefghijklmnopqrstuvwxyz012345")},
			`{"id":"c","why":"not_retryable","runs":1,"error":{"error":"refused: Authorization: Bearer REDACTED"},"earlier":[],"omitted":0}`},
		{"nil", batch.DeadLetter{ID: "d"}, `{"id":"d","why":"","runs":0,"error":null,"earlier":[],"omitted":0}`},
		{"core", batch.DeadLetter{ID: "e", Why: batch.WhyRunsUsed, Runs: 1, Err: &llmretry.Exhausted{}},
			`{"id":"e","why":"runs_used","runs":1,"error":{"outcome":"exhausted","item_retryable":true,"error":"llmretry: exhausted before any attempt: every backend failed; add a backend or widen the retry waits","usage_unknown":0,"attempts":[]},"earlier":[],"omitted":0}`},
		{"earlier", batch.DeadLetter{ID: "f", Why: batch.WhyRunsUsed, Runs: 9, Err: errors.New("run 9"),
			Earlier: []error{errors.New("run 1"), &llmretry.Exhausted{}, nil, errors.New("run 8 key=sk-abcdefghijklmnopqrstuvwxyz012345")}, Omitted: 4},
			`{"id":"f","why":"runs_used","runs":9,"error":{"error":"run 9"},"earlier":[{"error":"run 1"},` +
				`{"outcome":"exhausted","item_retryable":true,"error":"llmretry: exhausted before any attempt: every backend failed; add a backend or widen the retry waits","usage_unknown":0,"attempts":[]},null,{"error":"run 8 key=REDACTED"}],"omitted":4}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.d)
			if err != nil || string(got) != tc.want {
				t.Errorf("json.Marshal() = %s, %v, want %s, nil", got, err, tc.want)
			}
		})
	}
}

// JSONLines is safe for concurrent use: lines stay whole.
func TestJSONLinesConcurrent(t *testing.T) {
	var buf bytes.Buffer
	sink := batch.JSONLines(&buf)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if err := sink.Put(batch.DeadLetter{ID: fmt.Sprint(i), Runs: i, Err: errors.New(strings.Repeat("x", 1000))}); err != nil {
				t.Errorf("Put() = %v", err)
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d lines, want 50", len(lines))
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("line %.60q… is not valid JSON", l)
		}
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

func TestJSONLinesWriteError(t *testing.T) {
	err := batch.JSONLines(failWriter{}).Put(batch.DeadLetter{ID: "a"})
	if want := `llmretry: batch: writing dead letter of item "a": no space left on device`; err == nil || err.Error() != want {
		t.Errorf("Put() = %v, want %q", err, want)
	}
}

// A model's output that echoes a pasted key reaches no dead letter: the
// raw output of every run kept is redacted in the JSON, and the error
// values still hold it whole for the caller.
func TestDeadLettersRedactRawText(t *testing.T) {
	const secret = "sk-abcdefghijPLANTEDuvwxyz012345"
	raw := "the key you pasted is " + secret + ", and Bearer PLANTEDtoken0123"
	synctest.Test(t, func(t *testing.T) {
		chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
			Model: "m",
			Call: func(_ context.Context, id string) (string, error) {
				if id == "parse" {
					return "", llmretry.ParseFailure(raw, errors.New("invalid JSON"))
				}
				return "", &llmretry.Failure{Kind: llmretry.KindTransient, Status: 503, RawText: &raw}
			},
		}}}
		var rec record
		r := rec.runner(chain)
		r.Runs = 3
		r.Waits = []time.Duration{time.Second}
		var buf bytes.Buffer
		sink := batch.JSONLines(&buf)
		var letters []batch.DeadLetter
		r.Dead = batch.SinkFunc(func(d batch.DeadLetter) error {
			letters = append(letters, d)
			return sink.Put(d)
		})
		if _, err := r.Run(context.Background(), items("parse", "busy")); err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		if len(letters) != 2 {
			t.Fatalf("dead letters = %d, want 2", len(letters))
		}
		var ex *llmretry.Exhausted
		if !errors.As(letters[1].Err, &ex) || len(letters[1].Earlier) == 0 || ex.Attempts[0].RawText == nil || *ex.Attempts[0].RawText != raw {
			t.Fatalf("dead letter %+v: want runs before the last, and the raw output kept whole in the records", letters[1])
		}
		if !strings.Contains(buf.String(), "REDACTED") {
			t.Errorf("dead letters = %s, want the raw output there, redacted", buf.String())
		}
		for _, d := range letters {
			var logs bytes.Buffer
			slog.New(slog.NewJSONHandler(&logs, nil)).Error("dead", "err", d.Err, "earlier", d.Earlier)
			for what, s := range map[string]string{
				"JSONLines":    buf.String(),
				"json.Marshal": string(must(json.Marshal(d))),
				"fmt %v":       fmt.Sprintf("%v", d),
				"slog JSON":    logs.String(),
				"Err.Error()":  d.Err.Error(),
			} {
				if strings.Contains(s, "PLANTED") {
					t.Errorf("dead letter %q: %s leaks a planted secret:\n%s", d.ID, what, s)
				}
			}
		}
	})
}

// must returns b, failing on err: for values that always encode.
func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
