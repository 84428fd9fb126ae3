// Command llmretry reads what llmretry's batch runner left behind.
//
// Usage:
//
//	llmretry deadletters [-ids FILE] DEADLETTERS
//
// deadletters reads a dead-letter file, as batch.JSONLines writes it (one
// JSON object per line; see batch.ReadDeadLetters), and prints a summary
// of it:
//
//   - the dead items by why they are dead (not_retryable, runs_used);
//   - by outcome of their last run: exhausted, truncated, timed_out,
//     cancelled, or other for an error that is not the chain's;
//   - by kind of that outcome, as llmretry.Classify names it (for an
//     exhausted run, the kind of its last attempt);
//   - by model and by HTTP status of the last request that run sent
//     ("none" when it sent none, or got no status: a timeout, a dropped
//     connection);
//   - the usage billed, as the providers reported it, over every run the
//     file keeps (a dead letter keeps at most batch.KeptRuns runs), and
//     the attempts of unknown cost;
//   - the items worth running again (llmretry.RetryItem true for their
//     last run's error) and when: now, or once the wait that
//     llmretry.RetryItemAfter advises has passed, counted from now.
//
// With -ids FILE it writes the IDs of the items worth running again to
// FILE, one per line, in the order of the dead-letter file; with -ids -
// it writes them to standard output, and the summary to standard error,
// so that they can be piped to the job that runs them.
//
// It exits 1 when the file cannot be read or is not a dead-letter file
// (the error names the line), and 2 for a command line it does not
// understand.
//
// Run it from a checkout of the module with
//
//	go run github.com/llmretry/llmretry/cmd/llmretry deadletters dead-letters.jsonl
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usage is the top-level help.
const usage = `usage: llmretry deadletters [-ids FILE] DEADLETTERS

Commands:
  deadletters   summarise a dead-letter file of llmretry's batch runner
                and list the items worth running again

Run "llmretry deadletters -h" for its flags.
`

// run runs the command line args (without the program's name), writing
// to stdout and stderr, and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "deadletters":
		return deadLetters(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "llmretry: unknown command %q\n%s", args[0], usage)
	return 2
}

// deadLetters is the deadletters command.
func deadLetters(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("deadletters", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ids := fs.String("ids", "", "write the IDs of the items worth running again to `FILE`, one per line (- for standard output, the summary then going to standard error)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: llmretry deadletters [-ids FILE] DEADLETTERS

Summarises DEADLETTERS, a dead-letter file that batch.JSONLines wrote: the
items by why they are dead, by the outcome, kind, model and status of
their last run, the usage billed over the runs kept, and the items worth
running again (llmretry.RetryItem) and when (llmretry.RetryItemAfter).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "llmretry: deadletters takes one dead-letter file")
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "llmretry: %v\n", err)
		return 1
	}
	letters, err := batch.ReadDeadLetters(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "llmretry: %s: %v\n", path, strings.TrimPrefix(err.Error(), "llmretry: "))
		return 1
	}
	s := summarize(letters, time.Now())

	out := stdout
	if *ids == "-" {
		out = stderr
		writeIDs(stdout, s.rerun)
	}
	writeSummary(out, path, s)
	if *ids != "" && *ids != "-" {
		if err := writeIDsFile(*ids, s.rerun); err != nil {
			fmt.Fprintf(stderr, "llmretry: %v\n", err)
			return 1
		}
		fmt.Fprintf(out, "\n%s written to %s\n", plural(len(s.rerun), "ID"), *ids)
	}
	return 0
}

// summary is what the command says of a dead-letter file.
type summary struct {
	letters                           int
	why, outcome, kind, model, status map[string]int

	runs, omitted int // the runs the file keeps, and those it left out
	usage         llmretry.Usage
	unknown       int // attempts of unknown cost

	rerun      []string      // the IDs worth running again, in the file's order
	now        int           // of them, those that may run again now
	soonest    time.Duration // of the others, the shortest advised wait
	latest     time.Duration // and the longest
	notWorth   int           // items not worth running again
	summarized time.Time     // when the waits are counted from
}

// summarize reads the dead letters at now.
func summarize(letters []batch.DeadLetter, now time.Time) summary {
	s := summary{
		letters: len(letters),
		why:     map[string]int{}, outcome: map[string]int{}, kind: map[string]int{},
		model: map[string]int{}, status: map[string]int{},
		summarized: now,
	}
	for _, d := range letters {
		s.why[string(d.Why)]++
		s.outcome[outcomeOf(d.Err)]++
		s.kind[llmretry.Classify(d.Err).String()]++
		model, status := lastSent(records(d.Err))
		s.model[model]++
		s.status[status]++

		for _, err := range append(slices.Clone(d.Earlier), d.Err) {
			u, unknown := llmretry.TotalUsage(records(err))
			s.usage, s.unknown = s.usage.Add(u), s.unknown+unknown
			s.runs++
		}
		s.omitted += d.Omitted

		if !llmretry.RetryItem(d.Err) {
			s.notWorth++
			continue
		}
		s.rerun = append(s.rerun, d.ID)
		wait, ok := llmretry.RetryItemAfter(d.Err)
		if !ok {
			s.now++
			continue
		}
		if s.soonest == 0 || wait < s.soonest {
			s.soonest = wait
		}
		s.latest = max(s.latest, wait)
	}
	return s
}

// outcomeOf names err as its JSON record does: the chain's four errors by
// their outcome, "other" for any other error, "none" for nil.
func outcomeOf(err error) string {
	switch err.(type) {
	case nil:
		return "none"
	case *llmretry.Exhausted:
		return "exhausted"
	case *llmretry.Truncated:
		return "truncated"
	case *llmretry.TimedOut:
		return "timed_out"
	case *llmretry.Cancelled:
		return "cancelled"
	}
	return "other"
}

// records returns the attempts of one of the chain's errors; none for
// any other error.
func records(err error) []llmretry.Attempt {
	var exhausted *llmretry.Exhausted // a Truncated or TimedOut too
	var cancelled *llmretry.Cancelled
	switch {
	case errors.As(err, &exhausted):
		return exhausted.Attempts
	case errors.As(err, &cancelled):
		return cancelled.Attempts
	}
	return nil
}

// lastSent returns the model and status of the last attempt that was
// sent (a skip for a breaker sent nothing), "none" for either when there
// is none.
func lastSent(attempts []llmretry.Attempt) (model, status string) {
	for i := len(attempts) - 1; i >= 0; i-- {
		a := &attempts[i]
		if a.Skipped {
			continue
		}
		status = "none"
		if a.Status != 0 {
			status = strconv.Itoa(a.Status)
		}
		return a.Model, status
	}
	return "none", "none"
}

// writeSummary writes s, the summary of the file at path, to w.
func writeSummary(w io.Writer, path string, s summary) {
	fmt.Fprintf(w, "%s in %s\n", plural(s.letters, "dead letter"), path)
	for _, g := range []struct {
		title  string
		counts map[string]int
	}{
		{"by why", s.why},
		{"by outcome of the last run", s.outcome},
		{"by kind of that outcome", s.kind},
		{"by model of the last request sent", s.model},
		{"by status of that request", s.status},
	} {
		if len(g.counts) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", g.title)
		list := sorted(g.counts)
		names, digits := 0, 0
		for _, c := range list {
			names, digits = max(names, len(c.name)), max(digits, len(strconv.Itoa(c.n)))
		}
		for _, c := range list {
			fmt.Fprintf(w, "  %-*s  %*d\n", names, c.name, digits, c.n)
		}
	}

	fmt.Fprintf(w, "\nbilled over the %s kept", plural(s.runs, "run"))
	if s.omitted > 0 {
		fmt.Fprintf(w, " (%s left out of the file)", plural(s.omitted, "run"))
	}
	fmt.Fprintf(w, ": %d tokens in, %d out", s.usage.InputTokens, s.usage.OutputTokens)
	if s.usage.CachedInputTokens != 0 {
		fmt.Fprintf(w, ", %d cached in", s.usage.CachedInputTokens)
	}
	if s.usage.ReasoningTokens != 0 {
		fmt.Fprintf(w, ", %d reasoning", s.usage.ReasoningTokens)
	}
	fmt.Fprintf(w, "; %s of unknown cost\n", plural(s.unknown, "attempt"))

	fmt.Fprintf(w, "\nworth running again: %d of %d", len(s.rerun), s.letters)
	if s.notWorth > 0 {
		fmt.Fprintf(w, " (%d would fail the same way)", s.notWorth)
	}
	fmt.Fprintln(w)
	if s.now > 0 {
		fmt.Fprintf(w, "  now: %d\n", s.now)
	}
	if later := len(s.rerun) - s.now; later > 0 {
		at := func(d time.Duration) string {
			return fmt.Sprintf("%s (in %s)", s.summarized.Add(d).UTC().Format(time.RFC3339), d.Round(time.Second))
		}
		fmt.Fprintf(w, "  later, as a provider advised: %d, from %s", later, at(s.soonest))
		if s.latest != s.soonest {
			fmt.Fprintf(w, " to %s", at(s.latest))
		}
		fmt.Fprintln(w)
	}
}

// count is one line of a group.
type count struct {
	name string
	n    int
}

// sorted returns counts, the largest first, then by name.
func sorted(counts map[string]int) []count {
	var list []count
	for name, n := range counts {
		if name == "" {
			name = `""`
		}
		list = append(list, count{name, n})
	}
	slices.SortFunc(list, func(a, b count) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.name, b.name))
	})
	return list
}

// writeIDs writes ids to w, one per line.
func writeIDs(w io.Writer, ids []string) {
	for _, id := range ids {
		fmt.Fprintln(w, id)
	}
}

// writeIDsFile writes ids to the file at path, one per line.
func writeIDsFile(path string, ids []string) error {
	var b strings.Builder
	writeIDs(&b, ids)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// plural returns "1 run" or "3 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
