package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// line is how a reader of the dead letters decodes one.
type line struct {
	ID    string `json:"id"`
	Runs  int    `json:"runs"`
	Error struct {
		Outcome       string             `json:"outcome"`
		ItemRetryable bool               `json:"item_retryable"`
		Error         string             `json:"error"`
		Attempts      []llmretry.Attempt `json:"attempts"`
	} `json:"error"`
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
// the item's ID, its runs and the chain's record of the last run.
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
			var l line
			l.ID, l.Runs = d.ID, d.Runs
			var ex *llmretry.Exhausted
			if !errors.As(d.Err, &ex) {
				t.Fatalf("dead letter %s: Err = %T, want an *Exhausted", d.ID, d.Err)
			}
			l.Error.Outcome = map[string]string{"cut": "truncated", "busy": "exhausted"}[d.ID]
			l.Error.ItemRetryable = llmretry.RetryItem(d.Err)
			l.Error.Error = d.Err.Error()
			l.Error.Attempts = ex.Attempts
			want = append(want, l)
		}
		if len(want) != 2 || want[0].ID != "cut" || want[0].Runs != 1 || want[1].ID != "busy" || want[1].Runs != 3 {
			t.Fatalf("dead letters %+v, want cut after 1 run and busy after 3", letters)
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

// plainErr is an error that is not the chain's and has fields json would
// otherwise show.
type plainErr struct{ Path string }

func (e *plainErr) Error() string { return "open " + e.Path + ": disk full" }

// An error that is not the chain's encodes as {"error": its redacted
// text}, and a nil one as null.
func TestDeadLetterJSON(t *testing.T) {
	tests := []struct {
		name string
		d    batch.DeadLetter
		want string
	}{
		{"plain", batch.DeadLetter{ID: "a", Runs: 2, Err: errors.New("disk full")}, `{"id":"a","runs":2,"error":{"error":"disk full"}}`},
		{"struct_error", batch.DeadLetter{ID: "b", Runs: 1, Err: &plainErr{Path: "/tmp/x"}}, `{"id":"b","runs":1,"error":{"error":"open /tmp/x: disk full"}}`},
		{"redacted", batch.DeadLetter{ID: "c", Runs: 1, Err: errors.New("refused: Authorization: Bearer sk-abcdefghijklmnopqrstuvwxyz012345")},
			`{"id":"c","runs":1,"error":{"error":"refused: Authorization: Bearer REDACTED"}}`},
		{"nil", batch.DeadLetter{ID: "d"}, `{"id":"d","runs":0,"error":null}`},
		{"core", batch.DeadLetter{ID: "e", Runs: 3, Err: &llmretry.Exhausted{}},
			`{"id":"e","runs":3,"error":{"outcome":"exhausted","item_retryable":true,"error":"llmretry: exhausted before any attempt: every backend failed; add a backend or widen the retry waits","attempts":[]}}`},
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
	if want := `batch: writing dead letter of item "a": no space left on device`; err == nil || err.Error() != want {
		t.Errorf("Put() = %v, want %q", err, want)
	}
}
