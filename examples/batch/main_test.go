package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// deadLine is one line of dead-letters.jsonl, as a reader decodes it.
type deadLine struct {
	ID      string       `json:"id"`
	Why     string       `json:"why"`
	Runs    int          `json:"runs"`
	Error   deadRecord   `json:"error"`
	Earlier []deadRecord `json:"earlier"`
	Omitted int          `json:"omitted"`
}

// deadRecord is the chain's record of one run's error.
type deadRecord struct {
	Outcome       string            `json:"outcome"`
	ItemRetryable bool              `json:"item_retryable"`
	Error         string            `json:"error"`
	Usage         *json.RawMessage  `json:"usage"`
	UsageUnknown  int               `json:"usage_unknown"`
	Attempts      []json.RawMessage `json:"attempts"`
}

// readDead decodes the dead letters in the file path, one valid JSON
// object per line, by ID.
func readDead(t *testing.T, path string) map[string]deadLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dead := map[string]deadLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var d deadLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("line %.80q…: %v", sc.Text(), err)
		}
		if _, dup := dead[d.ID]; dup {
			t.Errorf("item %s has two dead letters", d.ID)
		}
		dead[d.ID] = d
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return dead
}

// emptyDir changes into a new empty directory, and checks at the end of
// the test that the demo left nothing in it.
func emptyDir(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	t.Cleanup(func() {
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			t.Errorf("the directory the demo ran in holds %v (%v), want nothing", entries, err)
		}
	})
}

// TestRun plays the whole demo, as go run does: the counts add up to
// 1,000, every long item is a truncated dead letter after one run, every
// broken one an exhausted dead letter after three, the file it names has
// one valid JSON line per dead item, and batch.ReadDeadLetters reads them
// back as the runner wrote them.
func TestRun(t *testing.T) {
	emptyDir(t)
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	var buf bytes.Buffer
	var written []batch.DeadLetter
	counts, err := play(context.Background(), &buf, false, path, func(d batch.DeadLetter) { written = append(written, d) })
	out := buf.String()
	if err != nil {
		t.Fatalf("run() error = %v, want nil; output:\n%s", err, out)
	}
	if counts.Total() != items || counts.NotRun != 0 {
		t.Errorf("run() counts = %+v, want %d in all, none not run", counts, items)
	}
	dead := readDead(t, path)
	if len(dead) != counts.Dead {
		t.Errorf("%d dead letters in %s, want %d (counts.Dead)", len(dead), path, counts.Dead)
	}
	for i := 1; i <= items; i++ {
		id := "ticket-" + leftPad(i)
		d, ok := dead[id]
		switch part(i) {
		case "-long":
			if !ok || d.Why != "not_retryable" || d.Runs != 1 || d.Error.Outcome != "truncated" || d.Error.ItemRetryable || len(d.Error.Attempts) == 0 {
				t.Errorf("dead letter of long item %s = %+v, %t; want truncated after 1 run, not retryable, with its attempts", id, d, ok)
			}
		case "-broken":
			if !ok || d.Why != "runs_used" || d.Runs != 3 || d.Error.Outcome != "exhausted" || !d.Error.ItemRetryable || len(d.Earlier) != 2 {
				t.Errorf("dead letter of broken item %s = %+v, %t; want exhausted after 3 runs used, with the 2 before", id, d, ok)
			}
		}
	}
	checkReadBack(t, path, written)
	for _, want := range []string{`Done in [0-9.]+s: \d+ succeeded`, `(?m)^Dead letters go to ` + regexp.QuoteMeta(path) + `\.$`,
		`written to ` + regexp.QuoteMeta(path), `(?m)^  truncated +25 `,
		`go run ./cmd/llmretry deadletters ` + regexp.QuoteMeta(path)} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("output lacks %q; output:\n%s", want, out)
		}
	}
}

// Cut short, the demo counts the items it could not finish as not run,
// never as dead, and the file still has a line per dead item.
func TestRunCancelled(t *testing.T) {
	emptyDir(t)
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var buf bytes.Buffer
	counts, err := run(ctx, &buf, false, path)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("run() error = %v, want context.DeadlineExceeded", err)
	}
	if counts.Total() == 0 || counts.Total() > items || counts.NotRun == 0 {
		t.Errorf("run() counts = %+v, want some items ended and some not run", counts)
	}
	if dead := readDead(t, path); len(dead) != counts.Dead {
		t.Errorf("%d dead letters in %s, want %d (counts.Dead)", len(dead), path, counts.Dead)
	}
	if want := strconv.Itoa(counts.NotRun) + " items were cut short"; !strings.Contains(buf.String(), want) {
		t.Errorf("output lacks %q; output:\n%s", want, buf.String())
	}
}

// Without -dead the dead letters go to a new temporary folder of their
// own, a fresh one each time; with it, to the file it names.
func TestDeadPath(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	first, err := deadPath("")
	if err != nil {
		t.Fatalf("deadPath(\"\") error = %v", err)
	}
	second, err := deadPath("")
	if err != nil {
		t.Fatalf("deadPath(\"\") error = %v", err)
	}
	for _, p := range []string{first, second} {
		dir := filepath.Dir(p)
		if filepath.Base(p) != deadFile || filepath.Dir(dir) != tmp {
			t.Errorf("deadPath(\"\") = %s, want %s in a new folder in %s", p, deadFile, tmp)
		}
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			t.Errorf("folder %s holds %v (%v), want a new empty one", dir, entries, err)
		}
	}
	if filepath.Dir(first) == filepath.Dir(second) {
		t.Errorf("deadPath(\"\") = %s twice, want a new folder each time", first)
	}
	if got, err := deadPath("out/dead.jsonl"); got != "out/dead.jsonl" || err != nil {
		t.Errorf("deadPath(%q) = %q, %v, want it back, nil", "out/dead.jsonl", got, err)
	}
}

func leftPad(i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("0", 4-len(s)) + s
}

// checkReadBack reads the dead letters in the file path back with
// batch.ReadDeadLetters and compares them with those written: the same
// IDs, whys, runs and omitted counts, and each run's error of the same
// type, with the same message, records (errors compared by text, times
// by instant), cause and RetryItem advice. RetryItemAfter counts from
// now, which moves between two calls: the decoded error's must lie
// between the original's just before and just after it.
func checkReadBack(t *testing.T, path string, written []batch.DeadLetter) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	read, err := batch.ReadDeadLetters(f)
	if err != nil {
		t.Fatalf("ReadDeadLetters(%s) error = %v", path, err)
	}
	if len(read) != len(written) {
		t.Fatalf("ReadDeadLetters(%s) = %d dead letters, want the %d written", path, len(read), len(written))
	}
	for i, w := range written {
		r := read[i]
		if r.ID != w.ID || r.Why != w.Why || r.Runs != w.Runs || r.Omitted != w.Omitted || len(r.Earlier) != len(w.Earlier) {
			t.Errorf("dead letter %d read back = %s %s %d runs, %d earlier, %d omitted; want %s %s %d, %d, %d",
				i, r.ID, r.Why, r.Runs, len(r.Earlier), r.Omitted, w.ID, w.Why, w.Runs, len(w.Earlier), w.Omitted)
			continue
		}
		for j, want := range append(slices.Clone(w.Earlier), w.Err) {
			got := append(slices.Clone(r.Earlier), r.Err)[j]
			if d := diffRun(want, got); d != "" {
				t.Errorf("dead letter of %s, run %d of those kept, read back differs:\n%s", w.ID, j+1, d)
			}
		}
	}
}

// diffRun returns how got, a run's error read back, differs from want,
// the one written; "" when it does not.
func diffRun(want, got error) string {
	if fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
		return fmt.Sprintf("type %T, want %T", got, want)
	}
	var d strings.Builder
	if got.Error() != want.Error() {
		fmt.Fprintf(&d, "Error() = %q, want %q\n", got, want)
	}
	if g, w := llmretry.RetryItem(got), llmretry.RetryItem(want); g != w {
		fmt.Fprintf(&d, "RetryItem = %v, want %v\n", g, w)
	}
	before, okBefore := llmretry.RetryItemAfter(want)
	after, ok := llmretry.RetryItemAfter(got)
	later, okLater := llmretry.RetryItemAfter(want)
	if after > before || after < later || (okBefore == okLater && ok != okBefore) {
		fmt.Fprintf(&d, "RetryItemAfter = %v, %v, want between %v, %v and %v, %v\n", after, ok, before, okBefore, later, okLater)
	}
	if diff := cmp.Diff(chainRecords(want), chainRecords(got), byText, byInstant); diff != "" {
		fmt.Fprintf(&d, "records (-want +got):\n%s", diff)
	}
	return d.String()
}

// chainRecords returns the records of one of the chain's errors.
func chainRecords(err error) []llmretry.Attempt {
	var exhausted *llmretry.Exhausted
	var cancelled *llmretry.Cancelled
	switch {
	case errors.As(err, &exhausted):
		return exhausted.Attempts
	case errors.As(err, &cancelled):
		return cancelled.Attempts
	}
	return nil
}

// byText compares errors by their redacted text, as a record keeps them.
var byText = cmp.Comparer(func(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return llmretry.Redact(a.Error()) == llmretry.Redact(b.Error())
})

// byInstant compares times by instant and offset, as a record keeps them.
var byInstant = cmp.Comparer(func(x, y time.Time) bool {
	_, xo := x.Zone()
	_, yo := y.Zone()
	return x.Equal(y) && xo == yo
})
