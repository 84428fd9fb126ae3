package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// errView is what a reader of a dead letter can tell of one run's error:
// its type, text and cause's text, its advice at this moment, and its
// records.
type errView struct {
	Type      string
	Text      string
	Cause     string
	RetryItem bool
	After     time.Duration
	AfterOK   bool
	Records   []llmretry.Attempt
}

// letterView is a dead letter as errViews.
type letterView struct {
	ID      string
	Why     batch.Why
	Runs    int
	Omitted int
	Err     errView
	Earlier []errView
}

func viewErr(err error) errView {
	if err == nil {
		return errView{}
	}
	v := errView{Type: fmt.Sprintf("%T", err), Text: llmretry.Redact(err.Error()), RetryItem: llmretry.RetryItem(err)}
	v.After, v.AfterOK = llmretry.RetryItemAfter(err)
	var ex *llmretry.Exhausted
	var ca *llmretry.Cancelled
	var to *llmretry.TimedOut
	switch {
	case errors.As(err, &ca):
		v.Records = ca.Attempts
		if ca.Cause != nil {
			v.Cause = llmretry.Redact(ca.Cause.Error())
		}
	case errors.As(err, &ex):
		v.Records = ex.Attempts
		if errors.As(err, &to) && to.Cause != nil {
			v.Cause = llmretry.Redact(to.Cause.Error())
		}
	}
	return v
}

func viewLetter(d batch.DeadLetter) letterView {
	v := letterView{ID: d.ID, Why: d.Why, Runs: d.Runs, Omitted: d.Omitted, Err: viewErr(d.Err)}
	for _, e := range d.Earlier {
		v.Earlier = append(v.Earlier, viewErr(e))
	}
	return v
}

// sameInstant compares times as a record keeps them: the instant and the
// offset, not the monotonic reading.
var sameInstant = cmp.Comparer(func(x, y time.Time) bool {
	_, xo := x.Zone()
	_, yo := y.Zone()
	return x.Equal(y) && xo == yo
})

// demoBatch runs a batch as examples/batch does, with the providers as
// in-process fakes so that it runs in virtual time: the primary is down
// from 2s to 5s (503, retry-after 2) and the fallback rate-limits every
// fourth request (429, retry-after 1); every 40th item is cut off at its
// budget everywhere, every 100th fails with 500 everywhere, and every
// 150th is rate limited everywhere for a minute at a time. It writes the
// dead letters with JSONLines to w, and returns them as the Sink got
// them.
func demoBatch(t *testing.T, n int, w *bytes.Buffer) []batch.DeadLetter {
	t.Helper()
	start := time.Now()
	part := func(id string) string {
		var i int
		fmt.Sscanf(id, "ticket-%d", &i)
		switch {
		case i%40 == 7:
			return "long"
		case i%100 == 50:
			return "broken"
		case i%150 == 20:
			return "limited"
		}
		return ""
	}
	header := func(after string) http.Header { return http.Header{"Retry-After": {after}} }
	var fallbackCalls atomic.Int64
	provider := func(name string, input int64) func(context.Context, string) (string, error) {
		return func(ctx context.Context, id string) (string, error) {
			time.Sleep(80 * time.Millisecond)
			if name == "fallback" && fallbackCalls.Add(1)%4 == 0 {
				return "", llmretry.StatusFailure(429, header("1"), errors.New("rate limited"))
			}
			if e := time.Since(start); name == "primary" && e >= 2*time.Second && e < 5*time.Second {
				return "", llmretry.StatusFailure(503, header("2"), errors.New("upstream connect error"))
			}
			usage := llmretry.Usage{InputTokens: input, OutputTokens: 20}
			switch part(id) {
			case "long":
				cut := llmretry.Truncation("The customer reports, at length, that")
				cut.Usage = &usage
				return "", cut
			case "broken":
				return "", llmretry.StatusFailure(500, nil, errors.New("internal error"))
			case "limited":
				return "", llmretry.StatusFailure(429, header("60"), errors.New("rate limited, key sk-Zq81Lw02Xe93Rt64Yu75Io86"))
			}
			llmretry.ReportUsage(ctx, usage)
			return "an answer to " + id, nil
		}
	}
	chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
		{Model: "gpt-4o", Call: provider("primary", 30), Timeout: 5 * time.Second,
			Retry: llmretry.Policy{Waits: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}, MaxWait: time.Second}},
		{Model: "claude-sonnet-4-5", Call: provider("fallback", 40), Timeout: 5 * time.Second,
			Retry: llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond}, MaxWait: 500 * time.Millisecond}},
	}}
	sink := batch.JSONLines(w)
	var letters []batch.DeadLetter
	r := &batch.Runner[string, string]{
		Chain:       chain,
		Concurrency: 16,
		Runs:        3,
		Waits:       []time.Duration{500 * time.Millisecond, time.Second},
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			letters = append(letters, d)
			return sink.Put(d)
		}),
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ticket-%04d", i+1)
	}
	if _, err := r.Run(context.Background(), items(ids...)); err != nil {
		t.Fatalf("Run() error = %v, want nil", err)
	}
	return letters
}

// The dead letters a batch wrote, read back, are the ones it put: each
// run's error of its own type, with the same records (errors compared by
// text), cause, RetryItem and RetryItemAfter (at the same virtual
// moment), and the same message.
func TestReadDeadLettersFromARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var file bytes.Buffer
		letters := demoBatch(t, 400, &file)
		got, err := batch.ReadDeadLetters(bytes.NewReader(file.Bytes()))
		if err != nil {
			t.Fatalf("ReadDeadLetters() error = %v", err)
		}
		var want, gotViews []letterView
		outcomes := map[string]int{}
		advised := 0
		for _, d := range letters {
			want = append(want, viewLetter(d))
			outcomes[fmt.Sprintf("%s %T", d.Why, d.Err)]++
			if _, ok := llmretry.RetryItemAfter(d.Err); ok {
				advised++
			}
		}
		for _, d := range got {
			gotViews = append(gotViews, viewLetter(d))
		}
		if diff := cmp.Diff(want, gotViews, sameText, sameInstant); diff != "" {
			t.Errorf("dead letters read back (-written +read):\n%s", diff)
		}
		// The run had dead letters of every sort the demo makes: the long
		// items (10, less any that met the outage and the rate limit on
		// every run, as goroutines happen to be scheduled, and used its
		// runs up), the 4 broken and the 3 limited ones, which end last,
		// still advised to wait.
		if n := outcomes["not_retryable *llmretry.Truncated"]; n == 0 || n > 10 || outcomes["runs_used *llmretry.Exhausted"] < 7 || len(outcomes) != 2 || advised == 0 {
			t.Errorf("dead letters by why and type: %v, %d with a RetryItemAfter; want up to 10 truncated, not retryable, at least 7 exhausted after their runs, some with a RetryItemAfter", outcomes, advised)
		}
	})
}

// A dead letter whose errors are not the chain's reads back with their
// text; null is nil, an empty earlier is nil, and unknown keys are
// ignored.
func TestDeadLetterUnmarshalJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want batch.DeadLetter
	}{
		{"plain", `{"id":"a","why":"runs_used","runs":1,"error":{"error":"disk full"},"earlier":[],"omitted":0}`,
			batch.DeadLetter{ID: "a", Why: batch.WhyRunsUsed, Runs: 1, Err: errors.New("disk full")}},
		{"nil", `{"id":"d","why":"","runs":0,"error":null,"earlier":[],"omitted":0}`, batch.DeadLetter{ID: "d"}},
		{"earlier", `{"id":"f","why":"runs_used","runs":9,"error":{"error":"run 9"},"earlier":[{"error":"run 1"},null,{"error":"run 8"}],"omitted":4,"new_key":1}`,
			batch.DeadLetter{ID: "f", Why: batch.WhyRunsUsed, Runs: 9, Err: errors.New("run 9"), Earlier: []error{errors.New("run 1"), nil, errors.New("run 8")}, Omitted: 4}},
		// What some other error's own MarshalJSON wrote: its text is the JSON.
		{"foreign", `{"id":"g","error":{"code": 7, "outcome":"mine"},"earlier":["x", 2]}`,
			batch.DeadLetter{ID: "g", Err: errors.New(`{"code":7,"outcome":"mine"}`), Earlier: []error{errors.New(`"x"`), errors.New(`2`)}}},
		{"minimal", `{"id":""}`, batch.DeadLetter{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got batch.DeadLetter
			if err := json.Unmarshal([]byte(tc.in), &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) error = %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got, sameText); diff != "" {
				t.Errorf("json.Unmarshal(%s) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

// A file that is not the runner's dead letters is refused with an error
// naming the line and what was wrong, and the dead letters before it.
func TestReadDeadLettersBadInput(t *testing.T) {
	good := `{"id":"a","why":"runs_used","runs":1,"error":{"error":"x"},"earlier":[],"omitted":0}`
	const prefix = "llmretry: batch: reading dead letters: "
	tests := []struct {
		name     string
		in       string
		wantRead int
		want     string // after the prefix
	}{
		{"not_json", good + "\nid: b\n", 1, "line 2: invalid character 'i' looking for beginning of value"},
		{"cut_off", good + "\n\n" + good[:40], 1, "line 3: unexpected end of JSON input"},
		{"array", `[1]`, 0, "line 1: want an object, got array"},
		{"null", `null`, 0, "line 1: want an object, got null"},
		{"no_id", `{"why":"runs_used"}`, 0, `line 1: no "id" key`},
		{"id_number", `{"id":7}`, 0, `line 1: field "id": want a string, got number`},
		{"why_bool", `{"id":"a","why":true}`, 0, `line 1: field "why": want a string, got boolean`},
		{"runs_string", `{"id":"a","runs":"3"}`, 0, `line 1: field "runs": want a number, got string`},
		{"runs_fraction", `{"id":"a","runs":1.5}`, 0, `line 1: field "runs": want a count, got 1.5`},
		{"omitted_negative", `{"id":"a","omitted":-1}`, 0, `line 1: field "omitted": want a count, got -1`},
		{"earlier_object", `{"id":"a","earlier":{}}`, 0, `line 1: field "earlier": want an array, got object`},
		{"bad_record", `{"id":"a","error":{"outcome":"exhausted","attempts":[{"kind":"fatal"}]}}`, 0,
			`line 1: field "error": decoding error record: attempts[0]: field "kind": unknown kind "fatal"`},
		{"bad_earlier_record", good + "\n" + `{"id":"b","earlier":[null,{"outcome":"truncated","attempts":3}]}`, 1,
			`line 2: field "earlier"[1]: decoding error record: field "attempts": want an array, got number`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := batch.ReadDeadLetters(strings.NewReader(tc.in))
			if err == nil || err.Error() != prefix+tc.want || len(got) != tc.wantRead {
				t.Errorf("ReadDeadLetters() = %d read, %v; want %d read, %q", len(got), err, tc.wantRead, prefix+tc.want)
			}
		})
	}

	// The reader's own error, with the line it was reading.
	broken := iotest.TimeoutReader(strings.NewReader(good + "\n" + good + "\n" + strings.Repeat("x", 10000)))
	got, err := batch.ReadDeadLetters(broken)
	if !errors.Is(err, iotest.ErrTimeout) || !strings.HasPrefix(err.Error(), prefix) || len(got) != 2 {
		t.Errorf("ReadDeadLetters(failing reader) = %d read, %v; want 2 read and an error wrapping %v", len(got), err, iotest.ErrTimeout)
	}
	// An empty file, blank lines and no newline at the end.
	for _, in := range []string{"", "\n\n", good, " \n" + good + "\n\n" + good} {
		want := strings.Count(in, good)
		if got, err := batch.ReadDeadLetters(strings.NewReader(in)); err != nil || len(got) != want {
			t.Errorf("ReadDeadLetters(%q) = %d read, %v; want %d, nil", in, len(got), err, want)
		}
	}
}

// FuzzReadDeadLetters checks that no file makes ReadDeadLetters panic,
// that its errors read as documented, and that what it reads, written
// again with JSONLines, reads back the same.
func FuzzReadDeadLetters(f *testing.F) {
	f.Add([]byte(`{"id":"a","why":"runs_used","runs":1,"error":{"error":"x"},"earlier":[],"omitted":0}` + "\n"))
	f.Add([]byte(`{"id":"b","why":"not_retryable","runs":1,"error":{"outcome":"truncated","item_retryable":false,"error":"llmretry: truncated","attempts":[{"backend":0,"model":"m","try":1,"kind":"truncated","status":0,"raw_text":"The","start":"2026-12-02T04:53:49.5Z","elapsed_ms":80,"next":"stop","why":"not_retryable","retry_in_ms":0,"delivered":false}]},"earlier":[null,{"outcome":"cancelled","cause":"c"}],"omitted":2}`))
	f.Add([]byte("{\"id\":\"c\",\"error\":{\"code\":7}}\n\n{\"id\":\"d\",\"earlier\":[\"x\",1,true]}"))
	f.Add([]byte(`{"id":"e","error":{"outcome":"exhausted","attempts":[{"kind":"kind(9)"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		letters, err := batch.ReadDeadLetters(bytes.NewReader(data))
		if err != nil {
			const prefix = "llmretry: batch: reading dead letters: line "
			if msg := err.Error(); !strings.HasPrefix(msg, prefix) || strings.Contains(msg, "\n") {
				t.Errorf("ReadDeadLetters(%q) error = %q, want one line starting %q", data, msg, prefix)
			}
			return
		}
		var again bytes.Buffer
		sink := batch.JSONLines(&again)
		for _, d := range letters {
			if err := sink.Put(d); err != nil {
				t.Fatalf("Put(%+v) of a dead letter read back: %v", d, err)
			}
		}
		back, err := batch.ReadDeadLetters(&again)
		if err != nil {
			t.Fatalf("ReadDeadLetters(%s) of dead letters written again: %v", again.String(), err)
		}
		var want, got []letterView
		for _, d := range letters {
			want = append(want, viewLetter(d))
		}
		for _, d := range back {
			got = append(got, viewLetter(d))
		}
		if diff := cmp.Diff(want, got, sameText, sameInstant); diff != "" {
			t.Errorf("read, written and read again (-first +second):\n%s", diff)
		}
	})
}
