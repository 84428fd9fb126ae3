package riverretry_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/riverretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// The timing of the integration tests, chosen together. River's
// JobTimeout is the chain's deadline. Within it a backend is tried three
// times: after the first try it waits 20ms, after the second not at all,
// and a zero last wait does not repeat, so the count does not depend on
// how fast the machine is. Each wait is taken only if it ends at least
// the reserve (1.5s) before the deadline; the two short ones fit unless
// a run has already taken about 2.5s. A retry-after of 3s never fits
// (3s + 1.5s > 4s), so the chain stops, advises about 3s, and the
// adapter snoozes the job instead of spending an attempt.
const (
	jobTimeout = 4 * time.Second
	reserve    = 1500 * time.Millisecond
	retryAfter = 3 * time.Second
	// tries is how many times a run tries each backend.
	tries = 3
	// maxSnoozes is the adapter's limit in these tests.
	maxSnoozes = 2
)

// newChain builds the chain every job runs: the job's model on an
// OpenAI-compatible provider, then the same model name on an
// Anthropic-compatible one.
func newChain(openai, anthropic *llmretrytest.Server) *llmretry.Chain[chatArgs, string] {
	policy := llmretry.Policy{Waits: []time.Duration{20 * time.Millisecond, 0}, Reserve: reserve, MaxWait: time.Minute}
	return &llmretry.Chain[chatArgs, string]{
		Backends: []llmretry.Backend[chatArgs, string]{
			{Model: "primary", Call: openAIChat(openai.OpenAIBaseURL()), Retry: policy},
			{Model: "secondary", Call: anthropicChat(anthropic.AnthropicBaseURL()), Retry: policy},
		},
	}
}

// category is one behaviour of the providers, and how many jobs meet it.
type category struct {
	name string
	n    int
	// script scripts model (the job's own) on both providers; i is the
	// job's number within the category.
	script func(model string, i int, openai, anthropic *llmretrytest.Server)
}

var rateLimited = llmretrytest.Status(429).WithHeader("retry-after", strconv.Itoa(int(retryAfter/time.Second)))

// rounds is how many runs of rate-limited job i are snoozed before its
// provider takes work again: one or two.
func rounds(i int) int { return 1 + i%2 }

func truncatedText(model string) string { return "The partial answer of " + model + " stopped" }

var categories = []category{
	{"truncated", 60, func(m string, _ int, o, a *llmretrytest.Server) {
		o.Script(m, llmretrytest.Truncated(truncatedText(m)))
		a.Script(m, llmretrytest.Truncated(truncatedText(m)+" again"))
	}},
	{"ratelimited", 100, func(m string, i int, o, a *llmretrytest.Server) {
		steps := make([]llmretrytest.Step, 0, 3)
		for range rounds(i) {
			steps = append(steps, rateLimited)
		}
		o.Script(m, append(steps, llmretrytest.Answer("Hello from "+m))...)
		a.Script(m, rateLimited)
	}},
	{"forever", 1, func(m string, _ int, o, a *llmretrytest.Server) {
		o.Script(m, rateLimited)
		a.Script(m, rateLimited)
	}},
	{"flaky", 150, func(m string, _ int, o, a *llmretrytest.Server) {
		o.Script(m, llmretrytest.Status(503), llmretrytest.Answer("Hello from "+m))
		a.Script(m, llmretrytest.Answer("never asked"))
	}},
	{"outage", 100, func(m string, _ int, o, a *llmretrytest.Server) {
		o.Script(m, llmretrytest.Status(503))
		// The secondary fails the first run's tries, and answers the
		// second run.
		steps := make([]llmretrytest.Step, 0, tries+1)
		for range tries {
			steps = append(steps, llmretrytest.Status(503))
		}
		a.Script(m, append(steps, llmretrytest.Answer("Hello from "+m))...)
	}},
	{"dead", 69, func(m string, _ int, o, a *llmretrytest.Server) {
		o.Script(m, llmretrytest.Status(503))
		a.Script(m, llmretrytest.Status(503))
	}},
	{"slow", 20, func(m string, _ int, o, a *llmretrytest.Server) {
		// The first answer would come after a minute: the job's
		// JobTimeout ends the run first.
		o.Script(m, llmretrytest.Answer("late").After(time.Minute), llmretrytest.Answer("Hello from "+m))
		a.Script(m, llmretrytest.Answer("never asked"))
	}},
}

// TestRiverTwoMachines runs 500 jobs on two River clients sharing one
// PostgreSQL database, against scripted providers, and checks where every
// job ended and what River stored for it.
func TestRiverTwoMachines(t *testing.T) {
	url := pgURL(t)
	const schema = "llmretry_river_machines"
	freshSchema(t, url, schema)

	openai := llmretrytest.NewServer()
	t.Cleanup(openai.Close)
	anthropic := llmretrytest.NewServer()
	t.Cleanup(anthropic.Close)

	var (
		total   int
		inserts []river.InsertManyParams
		catOf   = map[string]string{} // model -> category
		indexOf = map[string]int{}    // model -> number within its category
	)
	for _, c := range categories {
		for i := range c.n {
			model := fmt.Sprintf("%s-%d", c.name, i)
			c.script(model, i, openai, anthropic)
			catOf[model], indexOf[model] = c.name, i
			inserts = append(inserts, river.InsertManyParams{Args: chatArgs{Model: model}})
		}
		total += c.n
	}
	if total != 500 {
		t.Fatalf("categories hold %d jobs, want 500", total)
	}

	chain := newChain(openai, anthropic)
	log := &runLog{}
	// Machine A installs the adapter as middleware and leaves cancelling
	// to the ErrorHandler; machine B's worker calls the function, which
	// cancels with river.JobCancel. Both ways run the same jobs.
	a := machine{
		id: "machine-a", maxWorkers: 50, jobTimeout: jobTimeout, log: log,
		worker:     &chatWorker{chain: chain},
		middleware: []rivertype.Middleware{&riverretry.Adapter{MaxSnoozes: maxSnoozes, CancelByHandler: true}},
		handler:    &riverretry.ErrorHandler{},
	}
	b := machine{
		id: "machine-b", maxWorkers: 50, jobTimeout: jobTimeout, log: log,
		worker: &chatWorker{chain: chain, adapter: &riverretry.Adapter{MaxSnoozes: maxSnoozes}},
	}
	clientA, eventsA := a.start(t, url, schema)
	_, eventsB := b.start(t, url, schema)

	begin := time.Now()
	if _, err := clientA.InsertMany(t.Context(), inserts); err != nil {
		t.Fatalf("InsertMany() = %v", err)
	}
	waitFinal(t, clientA, total, 90*time.Second, eventsA, eventsB)
	t.Logf("500 jobs final after %v", time.Since(begin).Round(time.Millisecond))

	jobs := allJobs(t, clientA)
	if len(jobs) != total {
		t.Fatalf("river_job holds %d jobs, want %d", len(jobs), total)
	}
	runs := log.byJob()
	states := map[string]map[rivertype.JobState]int{}
	perClient := map[string]int{}
	for _, job := range jobs {
		model := argsOf(t, job).Model
		cat := catOf[model]
		if states[cat] == nil {
			states[cat] = map[rivertype.JobState]int{}
		}
		states[cat][job.State]++
		md, err := riverretry.JobMetadata(job)
		if err != nil {
			t.Fatalf("JobMetadata(%s) = %v", model, err)
		}
		jobRuns := runs[job.ID]
		for _, r := range jobRuns {
			perClient[r.client]++
		}
		checkRuns(t, job, model, jobRuns)

		switch cat {
		case "truncated":
			checkTruncated(t, job, model, jobRuns)
		case "ratelimited":
			k := rounds(indexOf[model])
			want := want{state: rivertype.JobStateCompleted, attempt: 1, errors: 0, snoozes: k, runs: k + 1}
			want.check(t, job, model, md, jobRuns)
			checkLastSnooze(t, model, md)
		case "forever":
			want := want{state: rivertype.JobStateDiscarded, attempt: maxAttempts, errors: maxAttempts, snoozes: maxSnoozes, runs: maxSnoozes + maxAttempts}
			want.check(t, job, model, md, jobRuns)
			for _, e := range job.Errors {
				s := decodeStored(t, job, e.Error)
				if s.Outcome != "exhausted" || len(s.Attempts) != 2 || s.Attempts[0].Status != 429 || s.Attempts[0].RetryAfter != retryAfter {
					t.Errorf("%s: stored error = %+v, want exhausted after a 429 with retry-after %v on each backend", model, s, retryAfter)
				}
			}
		case "flaky":
			want{state: rivertype.JobStateCompleted, attempt: 1, errors: 0, runs: 1}.check(t, job, model, md, jobRuns)
		case "outage":
			want{state: rivertype.JobStateCompleted, attempt: 2, errors: 1, runs: 2}.check(t, job, model, md, jobRuns)
			checkStoredTransient(t, job, model)
		case "dead":
			want{state: rivertype.JobStateDiscarded, attempt: maxAttempts, errors: maxAttempts, runs: maxAttempts}.check(t, job, model, md, jobRuns)
			checkStoredTransient(t, job, model)
		case "slow":
			want{state: rivertype.JobStateCompleted, attempt: 2, errors: 1, runs: 2}.check(t, job, model, md, jobRuns)
			checkStoredDeadline(t, job, model)
		default:
			t.Errorf("job %d has model %q, which no category scripted", job.ID, model)
		}
	}

	// The counts add up: every job inserted is in exactly one final state.
	sum := 0
	for _, c := range categories {
		for state, n := range states[c.name] {
			sum += n
			t.Logf("%-11s %-9s %3d", c.name, state, n)
		}
	}
	if sum != total {
		t.Errorf("final states add up to %d, want %d", sum, total)
	}
	t.Logf("runs per client: %v", perClient)
	// The margin the timing relies on: a run's short waits fit until it
	// has taken jobTimeout-reserve.
	var slowest time.Duration
	for _, job := range jobs {
		if catOf[argsOf(t, job).Model] == "slow" {
			continue
		}
		for _, r := range runs[job.ID] {
			slowest = max(slowest, r.end.Sub(r.start))
		}
	}
	t.Logf("slowest run outside the slow category: %v (the short waits fit until %v)", slowest.Round(time.Millisecond), jobTimeout-reserve)
	for _, id := range []string{a.id, b.id} {
		if perClient[id] == 0 {
			t.Errorf("client %s ran no job, want both clients to work", id)
		}
	}
}

// want is where a job should end up.
type want struct {
	state   rivertype.JobState
	attempt int // River's attempt count at the end
	errors  int // entries in the job's errors
	snoozes int // the adapter's count, and River's own
	runs    int // runs the workers saw
}

func (w want) check(t *testing.T, job *rivertype.JobRow, model string, md riverretry.Metadata, runs []*run) {
	t.Helper()
	got := want{state: job.State, attempt: job.Attempt, errors: len(job.Errors), snoozes: md.Snoozes, runs: len(runs)}
	if got != w {
		t.Errorf("%s: job = %+v, want %+v", model, got, w)
	}
	if river := riverSnoozes(t, job); river != w.snoozes {
		t.Errorf("%s: River's snoozes = %d, want %d", model, river, w.snoozes)
	}
	if md.Cancellations != 0 {
		t.Errorf("%s: %d cancellations recorded, want none", model, md.Cancellations)
	}
}

// riverSnoozes reads River's own snooze count from the job's metadata.
func riverSnoozes(t *testing.T, job *rivertype.JobRow) int {
	t.Helper()
	var md struct {
		Snoozes int `json:"snoozes"`
	}
	if len(job.Metadata) > 0 {
		if err := json.Unmarshal(job.Metadata, &md); err != nil {
			t.Fatalf("job %d: metadata %s: %v", job.ID, job.Metadata, err)
		}
	}
	return md.Snoozes
}

// checkRuns checks what holds for every job: no run started after the job
// completed, and at most one run succeeded.
func checkRuns(t *testing.T, job *rivertype.JobRow, model string, runs []*run) {
	t.Helper()
	ok := 0
	for i, r := range runs {
		if r.returned == nil {
			ok++
			if i != len(runs)-1 {
				t.Errorf("%s: run %d of %d succeeded, yet the job ran again", model, i+1, len(runs))
			}
		}
	}
	wantOK := 0
	if job.State == rivertype.JobStateCompleted {
		wantOK = 1
	}
	if ok != wantOK {
		t.Errorf("%s (%s): %d successful runs, want %d", model, job.State, ok, wantOK)
	}
}

// checkTruncated: cancelled on its first run, whatever attempts it had
// left, with the model's raw text in the stored record. The entry is the
// JSON alone when the ErrorHandler cancelled it (machine A), and has
// River's "JobCancelError: " before it when river.JobCancel did.
func checkTruncated(t *testing.T, job *rivertype.JobRow, model string, runs []*run) {
	t.Helper()
	if job.State != rivertype.JobStateCancelled || job.Attempt != 1 || len(job.Errors) != 1 || len(runs) != 1 {
		t.Errorf("%s: state %s, attempt %d, %d errors, %d runs; want cancelled on attempt 1 with 1 error and 1 run",
			model, job.State, job.Attempt, len(job.Errors), len(runs))
		return
	}
	text := job.Errors[0].Error
	if by := runs[0].client; by == "machine-b" {
		var ok bool
		if text, ok = strings.CutPrefix(text, "JobCancelError: "); !ok {
			t.Errorf("%s: cancelled by river.JobCancel, stored %q, want the JobCancelError: prefix", model, text)
		}
	}
	s := decodeStored(t, job, text)
	if s.Outcome != "truncated" || s.ItemRetryable || len(s.Attempts) != 2 {
		t.Fatalf("%s: stored %+v, want truncated, not retryable, 2 attempts", model, s)
	}
	for i, raw := range []string{truncatedText(model), truncatedText(model) + " again"} {
		if got := s.Attempts[i].RawText; got == nil || *got != raw {
			t.Errorf("%s: stored attempt %d raw text = %v, want %q", model, i, got, raw)
		}
	}
	var cancel *rivertype.JobCancelError
	if errors.As(runs[0].returned, &cancel) != (runs[0].client == "machine-b") {
		t.Errorf("%s: %s returned %T, want river.JobCancel only where the handler is not installed", model, runs[0].client, runs[0].returned)
	}
}

// checkLastSnooze: the last snoozed run's record is in the metadata,
// since River stores no error for a snoozed run.
func checkLastSnooze(t *testing.T, model string, md riverretry.Metadata) {
	t.Helper()
	last := md.LastSnooze
	if last == nil {
		t.Errorf("%s: no last snooze recorded", model)
		return
	}
	if last.Attempt != 1 || last.For <= 0 || last.For > retryAfter {
		t.Errorf("%s: last snooze = attempt %d for %v, want attempt 1, for at most %v", model, last.Attempt, last.For, retryAfter)
	}
	var s stored
	if err := json.Unmarshal(last.Error, &s); err != nil || s.Outcome != "exhausted" || len(s.Attempts) != 2 {
		t.Errorf("%s: last snooze record %s (%v), want the chain's exhausted record with 2 attempts", model, last.Error, err)
		return
	}
	for _, a := range s.Attempts {
		if a.Status != 429 || a.RetryAfter != retryAfter || a.Why != llmretry.WhyReserve {
			t.Errorf("%s: snoozed attempt = %v (status %d, why %s), want a 429 with retry-after %v, stopped by the reserve", model, a, a.Status, a.Why, retryAfter)
		}
	}
}

// checkStoredTransient: every stored entry is the chain's record of a
// 503 for each try on each backend, and River's entry is the JSON alone.
func checkStoredTransient(t *testing.T, job *rivertype.JobRow, model string) {
	t.Helper()
	for _, e := range job.Errors {
		s := decodeStored(t, job, e.Error)
		if s.Outcome != "exhausted" || !s.ItemRetryable || len(s.Attempts) != 2*tries {
			t.Errorf("%s: stored %s, want exhausted, retryable, %d attempts", model, e.Error, 2*tries)
			continue
		}
		for _, a := range s.Attempts {
			if a.Status != 503 || a.Kind != llmretry.KindTransient {
				t.Errorf("%s: stored attempt %v, want a transient 503", model, a)
			}
		}
	}
}

// checkStoredDeadline: the slow job's first run ended at River's
// JobTimeout, which the chain reported as its own deadline.
func checkStoredDeadline(t *testing.T, job *rivertype.JobRow, model string) {
	t.Helper()
	if len(job.Errors) == 0 {
		return
	}
	s := decodeStored(t, job, job.Errors[0].Error)
	if s.Outcome != "timed_out" || len(s.Attempts) != 1 || s.Attempts[0].Why != llmretry.WhyDeadline {
		t.Errorf("%s: stored %s, want timed_out with one attempt stopped by the deadline", model, job.Errors[0].Error)
		return
	}
	// The attempt ran until JobTimeout: the chain had River's deadline.
	if e := s.Attempts[0].Elapsed; e < jobTimeout-200*time.Millisecond || e > jobTimeout+time.Second {
		t.Errorf("%s: the timed-out attempt took %v, want about JobTimeout (%v)", model, e, jobTimeout)
	}
}
