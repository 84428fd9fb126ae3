package anthropicretry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// outageItem is one item of a scripted outage: the steps its requests to
// the primary and to the secondary play.
type outageItem struct {
	primary, secondary []llmretrytest.Step
}

// outage is a batch run into a provider having a bad day. Each item has
// a model of its own on each backend ("p-<id>", "s-<id>"), so its script
// plays the same whatever order the batch runs the items in, and the
// server's log tells which requests were whose.
var outage = map[string]outageItem{
	"answer":             {primary: steps(llmretrytest.Answer("Hello there, friend."))},
	"answer_short":       {primary: steps(llmretrytest.Answer("Hi."))},
	"retry_503":          {primary: steps(llmretrytest.Status(503), llmretrytest.Answer("ok then"))},
	"retry_429":          {primary: steps(llmretrytest.Status(429).WithHeader("retry-after-ms", "1"), llmretrytest.Answer("ok"))},
	"cut_after_usage":    {primary: steps(llmretrytest.StreamDrop(2), llmretrytest.Answer("whole now"))},
	"error_event":        {primary: steps(llmretrytest.StreamError("overloaded_error"), llmretrytest.Answer("ok"))},
	"unfinished":         {primary: steps(llmretrytest.StreamUnfinished(3), llmretrytest.Answer("ok"))},
	"stall_no_headers":   {primary: steps(llmretrytest.StallHeaders(), llmretrytest.Answer("late but fine"))},
	"stall_after_usage":  {primary: steps(llmretrytest.StreamStall(1), llmretrytest.Answer("ok"))},
	"parse_failure":      {primary: steps(llmretrytest.Answer(""), llmretrytest.Answer("now with text"))},
	"malformed":          {primary: steps(llmretrytest.Malformed(), llmretrytest.Answer("ok"))},
	"hangups":            {primary: steps(llmretrytest.Hangup()), secondary: steps(llmretrytest.Answer("from the secondary"))},
	"fail_over":          {primary: steps(llmretrytest.Status(503)), secondary: steps(llmretrytest.Answer("from the secondary"))},
	"fail_over_parse":    {primary: steps(llmretrytest.StreamError("api_error")), secondary: steps(llmretrytest.Answer(""), llmretrytest.Answer("at last"))},
	"second_run_answers": {primary: steps(llmretrytest.Status(503), llmretrytest.Status(503), llmretrytest.Status(503), llmretrytest.Answer("run two")), secondary: steps(llmretrytest.Status(503))},
	// Dead items: a run ends in the secondary's 503s twice over, in
	// billed cuts and unusable answers, in timeouts of unknown cost (some
	// after message_start, so known), in truncations or a refusal, which
	// no second run cures.
	"dead_truncated_json": {primary: steps(llmretrytest.Status(503)), secondary: steps(llmretrytest.Truncated("The answer is"))},
	"dead_503":            {primary: steps(llmretrytest.Status(503)), secondary: steps(llmretrytest.Status(503))},
	"dead_billed":         {primary: steps(llmretrytest.StreamDrop(1)), secondary: steps(llmretrytest.Answer(""))},
	"dead_timeouts":       {primary: steps(llmretrytest.StallHeaders(), llmretrytest.StreamStall(2)), secondary: steps(llmretrytest.Status(503), llmretrytest.StallHeaders())},
	"dead_truncated":      {primary: steps(llmretrytest.Truncated("one two three four")), secondary: steps(llmretrytest.Truncated("one two"))},
	"dead_refused":        {primary: steps(llmretrytest.Refuse("I can't"))},
}

func steps(s ...llmretrytest.Step) []llmretrytest.Step { return s }

// statusless reports whether a logged request's step answered with no
// status of any kind: a stall, a cut or garbled body, a hang-up.
func statusless(r llmretrytest.Request) bool {
	return !strings.HasPrefix(r.Step, "status ") && !strings.HasPrefix(r.Step, "stream error ")
}

// A batch over a scripted outage bills what the provider reported, and
// nothing else: the usage the server's log says each response told its
// client adds up to the batch's Counts.Usage; the requests that told none
// and had no status (a stall, a cut or a garbled body before any usage)
// are the batch's UsageUnknown; each dead letter's JSON carries every one
// of its attempts' usage, request for request as the server logged it,
// absent for those that told none, and totals that add up.
func TestBatchUsageMatchesServer(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	for id, it := range outage {
		srv.Script("p-"+id, it.primary...)
		if it.secondary == nil {
			it.secondary = steps(llmretrytest.Status(500)) // never reached while the primary answers
		}
		srv.Script("s-"+id, it.secondary...)
	}
	client := newClient(srv)
	// The Backends name no model: build picks each item's own, which the
	// records then name "unknown".
	model := func(prefix string) func(id string) anthropic.MessageNewParams {
		return func(id string) anthropic.MessageNewParams {
			p := build("Say hello.")
			p.Model = anthropic.Model(prefix + id)
			return p
		}
	}
	primary := anthropicretry.MessagesStream(client, "", model("p-"), nil)
	secondary := anthropicretry.Messages(client, "", model("s-"))
	for _, b := range []*llmretry.Backend[string, llmretry.Completion]{&primary, &secondary} {
		b.Retry = llmretry.Policy{Waits: []time.Duration{time.Millisecond}}
		b.StallTimeout = stall
	}

	var (
		mu      sync.Mutex
		records []llmretry.Attempt
		dead    = map[string][]byte{} // each dead item's letter, as JSON
	)
	r := &batch.Runner[string, llmretry.Completion]{
		Chain: &llmretry.Chain[string, llmretry.Completion]{
			Backends: []llmretry.Backend[string, llmretry.Completion]{primary, secondary},
			OnAttempt: func(_ context.Context, a llmretry.Attempt) {
				mu.Lock()
				records = append(records, a)
				mu.Unlock()
			},
		},
		Concurrency: 4,
		Runs:        2,
		Waits:       []time.Duration{time.Millisecond},
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			b, err := json.Marshal(d)
			dead[d.ID] = b
			return err
		}),
	}
	ids := slices.Sorted(maps.Keys(outage))
	items := make([]batch.Item[string], len(ids))
	for i, id := range ids {
		items[i] = batch.Item[string]{ID: id, Req: id}
	}
	counts, err := r.Run(t.Context(), slices.Values(items))
	if err != nil {
		t.Fatalf("Run() = %v, want nil", err)
	}
	log := srv.Requests()

	var wantDead []string
	for _, id := range ids {
		if strings.HasPrefix(id, "dead_") {
			wantDead = append(wantDead, id)
		}
	}
	if got := slices.Sorted(maps.Keys(dead)); !slices.Equal(got, wantDead) {
		t.Errorf("dead items = %v, want %v", got, wantDead)
	}
	if counts.Succeeded != len(ids)-len(wantDead) || counts.NotRun != 0 {
		t.Errorf("Run() = %v, want %d succeeded and none not run", counts, len(ids)-len(wantDead))
	}

	// What the provider told the clients, over the whole run.
	var billed llmretry.Usage
	unknown := 0
	for _, req := range log {
		switch {
		case req.Usage != nil:
			billed = billed.Add(llmretry.Usage(*req.Usage))
		case statusless(req):
			unknown++
		}
	}
	if billed == (llmretry.Usage{}) || unknown == 0 {
		t.Fatalf("the script bills %+v with %d requests of unknown cost; want both, or the test checks little", billed, unknown)
	}
	got := struct {
		Usage   llmretry.Usage
		Unknown int
	}{counts.Usage, counts.UsageUnknown}
	want := struct {
		Usage   llmretry.Usage
		Unknown int
	}{billed, unknown}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Run()'s Counts usage against the server's log (-log +counts):\n%s", diff)
	}
	// Every record, success or failure, carries what its response told,
	// nil for nothing: the same usages as the log's, request for request.
	if diff := cmp.Diff(usages(log), recordUsages(records)); diff != "" {
		t.Errorf("records' usage against the server's log, sorted (-log +records):\n%s", diff)
	}

	for _, id := range wantDead {
		letter, ok := dead[id]
		if !ok {
			continue
		}
		var reqs []llmretrytest.Request
		for _, req := range log {
			if req.Model == "p-"+id || req.Model == "s-"+id {
				reqs = append(reqs, req)
			}
		}
		checkDeadLetter(t, id, letter, reqs)
	}
}

// errorRecord is what a test reads of a chain error's JSON.
type errorRecord struct {
	Usage        *llmretry.Usage    `json:"usage"`
	UsageUnknown int                `json:"usage_unknown"`
	Attempts     []llmretry.Attempt `json:"attempts"`
}

// checkDeadLetter checks that the dead letter of item id, as JSON, holds
// one attempt per request in reqs (the item's, in the order the server
// read them) with the usage that request told, and that each run's
// error totals its own attempts' usage.
func checkDeadLetter(t *testing.T, id string, letter []byte, reqs []llmretrytest.Request) {
	t.Helper()
	var d struct {
		Error   errorRecord   `json:"error"`
		Earlier []errorRecord `json:"earlier"`
	}
	if err := json.Unmarshal(letter, &d); err != nil {
		t.Fatalf("dead letter of %s: %v\n%s", id, err, letter)
	}
	var attempts []llmretry.Attempt
	for i, run := range append(d.Earlier, d.Error) {
		total, unknown := llmretry.TotalUsage(run.Attempts)
		var wantTotal *llmretry.Usage
		for _, a := range run.Attempts {
			if a.Usage != nil {
				wantTotal = &total
			}
		}
		if diff := cmp.Diff(wantTotal, run.Usage); diff != "" {
			t.Errorf("dead letter of %s, run %d: usage against its attempts' total (-attempts +usage):\n%s", id, i+1, diff)
		}
		if run.UsageUnknown != unknown {
			t.Errorf("dead letter of %s, run %d: usage_unknown = %d, want %d", id, i+1, run.UsageUnknown, unknown)
		}
		attempts = append(attempts, run.Attempts...)
	}
	var want, got []*llmretry.Usage
	for _, req := range reqs {
		want = append(want, toUsage(req.Usage))
	}
	for _, a := range attempts {
		got = append(got, a.Usage)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letter of %s: its attempts' usage against the server's log (-log +letter):\n%s", id, diff)
	}
}

// toUsage is what a logged usage reads as in a record.
func toUsage(u *llmretrytest.Usage) *llmretry.Usage {
	if u == nil {
		return nil
	}
	c := llmretry.Usage(*u)
	return &c
}

// usages lists the log's usages as text, sorted, "none" for nil.
func usages(log []llmretrytest.Request) []string {
	var us []string
	for _, req := range log {
		us = append(us, usageText(toUsage(req.Usage)))
	}
	slices.Sort(us)
	return us
}

// recordUsages lists the records' usages as usages does the log's.
func recordUsages(records []llmretry.Attempt) []string {
	var us []string
	for _, a := range records {
		us = append(us, usageText(a.Usage))
	}
	slices.Sort(us)
	return us
}

func usageText(u *llmretry.Usage) string {
	if u == nil {
		return "none"
	}
	return fmt.Sprintf("%+v", *u)
}
