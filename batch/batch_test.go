package batch_test

import (
	"context"
	"errors"
	"iter"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
)

// Failures a fake backend returns, and what the chain makes of them.
var (
	// overloaded gives an *Exhausted that is retryable, with no advice.
	overloaded = llmretry.StatusFailure(503, nil, errors.New("overloaded"))
	// cut gives a *Truncated: never retryable.
	cut = llmretry.Truncation("the answer was cut")
	// refused gives an *Exhausted whose every attempt was rejected: never
	// retryable.
	refused = llmretry.StatusFailure(400, nil, errors.New("prompt is too long"))
)

// limited is a 429 whose retry-after advises running the item again after
// d.
func limited(d time.Duration) error {
	h := http.Header{}
	h.Set("Retry-After", strconv.Itoa(int(d/time.Second)))
	return llmretry.StatusFailure(429, h, errors.New("rate limited"))
}

// fake is a backend scripted per item: the request is the item's ID, and
// run n of an item returns script[ID][n-1] (the last entry repeats; nil or
// no script answers). It records when each run began, counted from
// start, and the most calls it had in flight at once.
type fake struct {
	start  time.Time
	took   time.Duration // each call's time, cut short by its context
	script map[string][]error

	mu          sync.Mutex
	runs        map[string][]time.Duration
	inFlight    int
	maxInFlight int
	calls       int
}

func newFake(took time.Duration, script map[string][]error) *fake {
	return &fake{start: time.Now(), took: took, script: script, runs: map[string][]time.Duration{}}
}

func (f *fake) call(ctx context.Context, id string) (string, error) {
	f.mu.Lock()
	f.runs[id] = append(f.runs[id], time.Since(f.start))
	n := len(f.runs[id])
	f.calls++
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	if f.took > 0 {
		t := time.NewTimer(f.took)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	// Every call that ran its course was billed, failed ones included.
	llmretry.ReportUsage(ctx, perCall)
	if s := f.script[id]; len(s) > 0 {
		if err := s[min(n, len(s))-1]; err != nil {
			return "", err
		}
	}
	return "answer " + id, nil
}

// perCall is what the fake reports each call that ran its course cost.
var perCall = llmretry.Usage{InputTokens: 10, OutputTokens: 3}

// billed is what n calls of the fake cost.
func billed(n int) llmretry.Usage {
	return llmretry.Usage{InputTokens: perCall.InputTokens * int64(n), OutputTokens: perCall.OutputTokens * int64(n)}
}

// chain is a one-backend chain without retries of its own, so that each
// run of an item is one call.
func (f *fake) chain() *llmretry.Chain[string, string] {
	return &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{Model: "m", Call: f.call}}}
}

// record collects what a Runner reports. Run calls its callbacks one at a
// time and returns after the last, so it needs no lock.
type record struct {
	results  map[string]string
	dead     map[string]batch.DeadLetter
	notRun   map[string]error
	progress []batch.Counts
	ended    []string // every item, in the order it ended
}

// runner returns a Runner over chain that reports to rec.
func (rec *record) runner(chain *llmretry.Chain[string, string]) *batch.Runner[string, string] {
	*rec = record{results: map[string]string{}, dead: map[string]batch.DeadLetter{}, notRun: map[string]error{}}
	return &batch.Runner[string, string]{
		Chain: chain,
		OnResult: func(item batch.Item[string], resp string) {
			rec.results[item.ID] = resp
			rec.ended = append(rec.ended, item.ID)
		},
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			rec.dead[d.ID] = d
			rec.ended = append(rec.ended, d.ID)
			return nil
		}),
		OnNotRun: func(item batch.Item[string], last error) {
			rec.notRun[item.ID] = last
			rec.ended = append(rec.ended, item.ID)
		},
		OnProgress: func(c batch.Counts) { rec.progress = append(rec.progress, c) },
	}
}

// items yields an item per ID, with the ID as its request.
func items(ids ...string) iter.Seq[batch.Item[string]] {
	return func(yield func(batch.Item[string]) bool) {
		for _, id := range ids {
			if !yield(batch.Item[string]{ID: id, Req: id}) {
				return
			}
		}
	}
}

// numbered returns IDs "0" to "n-1".
func numbered(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	return ids
}

// endlessCap is where endless gives up, so that a runner that never
// stops taking items fails a test instead of hanging it.
const endlessCap = 100_000

// endless yields items "0", "1", … until Run stops taking them (or
// endlessCap), and counts in *taken the items it gave.
func endless(taken *int) iter.Seq[batch.Item[string]] {
	return func(yield func(batch.Item[string]) bool) {
		for i := range endlessCap {
			*taken++
			if !yield(batch.Item[string]{ID: strconv.Itoa(i), Req: strconv.Itoa(i)}) {
				return
			}
		}
	}
}

// Each path of the routing, with the exact virtual times of the runs.
func TestRouting(t *testing.T) {
	s := time.Second
	tests := []struct {
		name      string
		runs      int
		waits     []time.Duration
		script    []error
		wantTimes []time.Duration // when each run began
		wantDead  int             // the dead letter's Runs; 0: the item succeeded
		wantErr   any             // for a dead letter, the type errors.As must find
	}{
		{name: "success", script: nil, wantTimes: []time.Duration{0}},
		{name: "never_retryable_truncated", script: []error{cut}, wantTimes: []time.Duration{0}, wantDead: 1, wantErr: new(*llmretry.Truncated)},
		{name: "never_retryable_refused", script: []error{refused}, wantTimes: []time.Duration{0}, wantDead: 1, wantErr: new(*llmretry.Exhausted)},
		{name: "rerun_after_own_waits", script: []error{overloaded, overloaded, nil}, wantTimes: []time.Duration{0, 10 * s, 30 * s}},
		{name: "rerun_after_advice", script: []error{limited(7 * s), nil}, wantTimes: []time.Duration{0, 7 * s}},
		{name: "advice_longer_than_wait", script: []error{limited(70 * s), nil}, wantTimes: []time.Duration{0, 70 * s}},
		{name: "advice_then_own_wait", script: []error{limited(7 * s), overloaded, nil}, wantTimes: []time.Duration{0, 7 * s, 27 * s}},
		{name: "runs_used_up", script: []error{overloaded}, wantTimes: []time.Duration{0, 10 * s, 30 * s}, wantDead: 3, wantErr: new(*llmretry.Exhausted)},
		{name: "last_wait_repeats", runs: 5, script: []error{overloaded}, wantTimes: []time.Duration{0, 10 * s, 30 * s, 50 * s, 70 * s}, wantDead: 5, wantErr: new(*llmretry.Exhausted)},
		{name: "one_run", runs: 1, script: []error{overloaded}, wantTimes: []time.Duration{0}, wantDead: 1, wantErr: new(*llmretry.Exhausted)},
		{name: "defaults", waits: []time.Duration{}, script: []error{overloaded}, wantTimes: []time.Duration{0, time.Minute, 6 * time.Minute}, wantDead: 3, wantErr: new(*llmretry.Exhausted)},
		// Not the runner's withdrawal: a run lost, not the batch.
		{name: "backend_withdrawal", script: []error{context.Canceled, nil}, wantTimes: []time.Duration{0, 10 * s}},
		{name: "backend_withdrawal_used_up", script: []error{context.Canceled}, wantTimes: []time.Duration{0, 10 * s, 30 * s}, wantDead: 3, wantErr: new(*llmretry.Cancelled)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				f := newFake(0, map[string][]error{"x": tc.script})
				var rec record
				r := rec.runner(f.chain())
				r.Runs = tc.runs
				r.Waits = tc.waits
				if tc.waits == nil {
					r.Waits = []time.Duration{10 * s, 20 * s}
				}
				counts, err := r.Run(context.Background(), items("x"))
				if err != nil {
					t.Fatalf("Run() error = %v, want nil", err)
				}
				if diff := cmp.Diff(tc.wantTimes, f.runs["x"]); diff != "" {
					t.Errorf("run times (-want +got):\n%s", diff)
				}
				want := batch.Counts{Succeeded: 1}
				if tc.wantDead > 0 {
					want = batch.Counts{Dead: 1}
				}
				want.Usage = billed(len(f.runs["x"]))
				if counts != want {
					t.Errorf("Run() counts = %+v, want %+v", counts, want)
				}
				if tc.wantDead == 0 {
					if got := rec.results["x"]; got != "answer x" {
						t.Errorf("OnResult got %q, want %q", got, "answer x")
					}
					return
				}
				d, ok := rec.dead["x"]
				if !ok {
					t.Fatalf("no dead letter for x; results %v, not run %v", rec.results, rec.notRun)
				}
				if d.Runs != tc.wantDead {
					t.Errorf("dead letter Runs = %d, want %d", d.Runs, tc.wantDead)
				}
				if !errors.As(d.Err, tc.wantErr) {
					t.Errorf("dead letter Err = %T, want %T", d.Err, tc.wantErr)
				}
			})
		})
	}
}

// The context ended at any point: every item taken ends exactly once, and
// those the cancellation kept from finishing are not run, never dead.
// Nothing runs after Run returns.
func TestCancelCountsAddUp(t *testing.T) {
	cancelAt := []time.Duration{-1, 0, 1, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond,
		2 * time.Second, 3500 * time.Millisecond, 4 * time.Second, 10 * time.Second, 23*time.Second + 1}
	rng := rand.New(rand.NewPCG(10, 2))
	for range 10 {
		cancelAt = append(cancelAt, time.Duration(rng.Int64N(int64(20*time.Second))))
	}
	for _, at := range cancelAt {
		t.Run(at.String(), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				// Every third item is overloaded once, every fifth rate
				// limited once: so that items wait between runs too.
				script := map[string][]error{}
				for i := range 1000 {
					switch {
					case i%3 == 0:
						script[strconv.Itoa(i)] = []error{overloaded, nil}
					case i%5 == 1:
						script[strconv.Itoa(i)] = []error{limited(3 * time.Second), nil}
					}
				}
				f := newFake(time.Second, script)
				var rec record
				r := rec.runner(f.chain())
				r.Concurrency = 4
				r.Waits = []time.Duration{2 * time.Second}
				var returned atomic.Bool
				r.OnProgress = func(c batch.Counts) {
					if returned.Load() {
						t.Errorf("OnProgress(%+v) after Run returned", c)
					}
					rec.progress = append(rec.progress, c)
				}

				cause := errors.New("the operator pressed ctrl-c")
				ctx, cancel := context.WithCancelCause(context.Background())
				if at < 0 {
					cancel(cause) // before Run: nothing is taken
				} else {
					time.AfterFunc(at, func() { cancel(cause) })
				}
				taken := 0
				counts, err := r.Run(ctx, endless(&taken))
				returned.Store(true)
				calls := f.calls

				if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
					t.Errorf("Run() error = %v, want one matching context.Canceled and the cause", err)
				}
				if taken >= endlessCap {
					t.Errorf("Run() took all %d items, want it to stop taking them once cancelled", taken)
				}
				if counts.Total() != taken {
					t.Errorf("Run() counts = %+v, total %d, want a total of %d (items taken)", counts, counts.Total(), taken)
				}
				if counts.Dead != 0 {
					t.Errorf("Run() counts = %+v, want none dead", counts)
				}
				if len(rec.results) != counts.Succeeded || len(rec.notRun) != counts.NotRun {
					t.Errorf("Run() counts = %+v, but %d results and %d not run reported", counts, len(rec.results), len(rec.notRun))
				}
				// Every item taken ended once: IDs 0 to taken-1, each once.
				ended := slices.Clone(rec.ended)
				slices.SortFunc(ended, func(a, b string) int {
					x, _ := strconv.Atoi(a)
					y, _ := strconv.Atoi(b)
					return x - y
				})
				if diff := cmp.Diff(numbered(taken), ended, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("items ended (-want +got):\n%s", diff)
				}
				checkProgress(t, rec.progress, counts)

				// Whatever was left would run in the next virtual hour.
				time.Sleep(time.Hour)
				if f.calls != calls {
					t.Errorf("%d calls after Run returned", f.calls-calls)
				}
			})
		})
	}
}

// checkProgress checks that OnProgress came after every item with counts
// that add up, ending with the counts Run returned.
func checkProgress(t *testing.T, progress []batch.Counts, final batch.Counts) {
	t.Helper()
	for i, c := range progress {
		if c.Total() != i+1 {
			t.Errorf("OnProgress call %d got %+v (total %d), want a total of %d", i+1, c, c.Total(), i+1)
		}
	}
	if len(progress) != final.Total() {
		t.Errorf("OnProgress called %d times, want %d (once per item)", len(progress), final.Total())
	}
	if len(progress) > 0 && progress[len(progress)-1] != final {
		t.Errorf("last OnProgress got %+v, want Run's %+v", progress[len(progress)-1], final)
	}
}

// A batch that ends by itself: every item accounted for, progress after
// each, and a nil error.
func TestCountsAddUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := map[string][]error{}
		for i := range 100 {
			switch i % 4 {
			case 1:
				script[strconv.Itoa(i)] = []error{cut}
			case 2:
				script[strconv.Itoa(i)] = []error{overloaded}
			case 3:
				script[strconv.Itoa(i)] = []error{limited(5 * time.Second), nil}
			}
		}
		f := newFake(time.Second, script)
		var rec record
		r := rec.runner(f.chain())
		r.Waits = []time.Duration{time.Second}
		counts, err := r.Run(context.Background(), slices.Values(itemList(numbered(100))))
		if err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		// Dead items' runs are billed too: the total is every call's.
		want := batch.Counts{Succeeded: 50, Dead: 50, Usage: billed(f.calls)}
		if counts != want {
			t.Errorf("Run() counts = %+v, want %+v", counts, want)
		}
		checkProgress(t, rec.progress, counts)
	})
}

func itemList(ids []string) []batch.Item[string] {
	var list []batch.Item[string]
	for id := range items(ids...) {
		list = append(list, id)
	}
	return list
}

// No more than Concurrency items run at once, and the bound is reached.
func TestConcurrencyBound(t *testing.T) {
	for _, n := range []int{1, 3, 8} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				script := map[string][]error{}
				for i := range 40 {
					if i%2 == 0 {
						script[strconv.Itoa(i)] = []error{overloaded, nil}
					}
				}
				f := newFake(time.Second, script)
				var rec record
				r := rec.runner(f.chain())
				r.Concurrency = n
				r.Waits = []time.Duration{500 * time.Millisecond}
				if _, err := r.Run(context.Background(), items(numbered(40)...)); err != nil {
					t.Fatalf("Run() error = %v, want nil", err)
				}
				if f.maxInFlight != n {
					t.Errorf("at most %d calls in flight, want %d", f.maxInFlight, n)
				}
			})
		})
	}
}

// An item waiting between runs holds no slot: with one slot, the second
// item runs while the first waits.
func TestWaitingHoldsNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(time.Second, map[string][]error{"a": {overloaded, nil}})
		var rec record
		r := rec.runner(f.chain())
		r.Concurrency = 1
		r.Waits = []time.Duration{10 * time.Second}
		if _, err := r.Run(context.Background(), items("a", "b")); err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		want := map[string][]time.Duration{"a": {0, 11 * time.Second}, "b": {time.Second}}
		if diff := cmp.Diff(want, f.runs); diff != "" {
			t.Errorf("run times (-want +got):\n%s", diff)
		}
	})
}

// Pending bounds the items taken and not ended, and is reached.
func TestPendingBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := map[string][]error{}
		for i := range 20 {
			script[strconv.Itoa(i)] = []error{overloaded, nil}
		}
		f := newFake(time.Second, script)
		var rec record
		r := rec.runner(f.chain())
		r.Concurrency = 1
		r.Pending = 3
		r.Waits = []time.Duration{10 * time.Second}
		var ended atomic.Int64
		r.OnProgress = func(c batch.Counts) { ended.Store(int64(c.Total())) }
		taken, most := 0, 0
		seq := func(yield func(batch.Item[string]) bool) {
			for item := range items(numbered(20)...) {
				taken++
				most = max(most, taken-int(ended.Load()))
				if !yield(item) {
					return
				}
			}
		}
		counts, err := r.Run(context.Background(), seq)
		if err != nil || counts.Succeeded != 20 {
			t.Fatalf("Run() = %+v, %v, want 20 succeeded, nil", counts, err)
		}
		if most != 3 {
			t.Errorf("at most %d items pending, want 3", most)
		}
	})
}

// A Sink that fails stops the batch: Run returns its error, naming the
// item, and the counts still add up.
func TestSinkFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := map[string][]error{}
		for i := range 1000 {
			if i%10 == 5 {
				script[strconv.Itoa(i)] = []error{cut}
			}
		}
		f := newFake(time.Second, script)
		var rec record
		r := rec.runner(f.chain())
		diskFull := errors.New("disk full")
		r.Dead = batch.SinkFunc(func(batch.DeadLetter) error { return diskFull })
		// A finite iterator, so that a runner that ignored the Sink's
		// error would end rather than run forever.
		taken := 0
		seq := func(yield func(batch.Item[string]) bool) {
			for item := range items(numbered(1000)...) {
				taken++
				if !yield(item) {
					return
				}
			}
		}
		counts, err := r.Run(context.Background(), seq)
		if !errors.Is(err, diskFull) {
			t.Errorf("Run() error = %v, want one wrapping %v", err, diskFull)
		}
		if want := `llmretry: batch: dead letter of item "5" not stored: disk full`; err == nil || err.Error() != want {
			t.Errorf("Run() error = %v, want %q", err, want)
		}
		if counts.Total() != taken || counts.Dead != 1 || taken > 20 {
			t.Errorf("Run() counts = %+v after %d items taken, want them to add up, with one dead, soon", counts, taken)
		}
	})
}

// A runner set up wrong takes no item.
func TestConfigErrors(t *testing.T) {
	f := newFake(0, nil)
	sink := batch.SinkFunc(func(batch.DeadLetter) error { return nil })
	tests := []struct {
		name string
		r    *batch.Runner[string, string]
		want string
	}{
		{"no_chain", &batch.Runner[string, string]{Dead: sink}, "llmretry: batch: chain is nil: llmretry: invalid configuration"},
		{"no_sink", &batch.Runner[string, string]{Chain: f.chain()}, "llmretry: batch: dead-letter sink is nil: llmretry: invalid configuration"},
		{"negative_concurrency", &batch.Runner[string, string]{Chain: f.chain(), Dead: sink, Concurrency: -1}, "llmretry: batch: concurrency -1 is negative: llmretry: invalid configuration"},
		{"negative_pending", &batch.Runner[string, string]{Chain: f.chain(), Dead: sink, Pending: -1}, "llmretry: batch: pending -1 is negative: llmretry: invalid configuration"},
		{"negative_runs", &batch.Runner[string, string]{Chain: f.chain(), Dead: sink, Runs: -2}, "llmretry: batch: runs -2 is negative: llmretry: invalid configuration"},
		{"negative_wait", &batch.Runner[string, string]{Chain: f.chain(), Dead: sink, Waits: []time.Duration{1, -1}}, "llmretry: batch: wait 2 is negative: llmretry: invalid configuration"},
		{"bad_chain", &batch.Runner[string, string]{Chain: &llmretry.Chain[string, string]{}, Dead: sink}, "llmretry: chain has no backends"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pulled := false
			seq := func(yield func(batch.Item[string]) bool) { pulled = true }
			counts, err := tc.r.Run(context.Background(), seq)
			if err == nil || err.Error() != tc.want || !errors.Is(err, llmretry.ErrConfig) || llmretry.RetryItem(err) {
				t.Errorf("Run() error = %v, want %q wrapping ErrConfig, RetryItem false", err, tc.want)
			}
			if pulled || counts != (batch.Counts{}) {
				t.Errorf("Run() = %+v, pulled %t; want nothing taken", counts, pulled)
			}
		})
	}
}

// An item whose last run is cut short by the cancellation is not run,
// not dead: the failure was the cancellation's, not the item's. An item
// that failed for good before the cancellation stays dead.
func TestCancelDuringLastRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake(time.Second, map[string][]error{"busy": {overloaded}, "cut": {cut}})
		var rec record
		r := rec.runner(f.chain())
		r.Runs = 2
		r.Waits = []time.Duration{time.Second}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(2500*time.Millisecond, cancel) // busy's second run is from 2s to 3s
		counts, err := r.Run(ctx, items("busy", "cut"))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() error = %v, want context.Canceled", err)
		}
		// The two runs that ended were billed; the one cut short by the
		// cancellation may have been: its cost is unknown.
		if want := (batch.Counts{Dead: 1, NotRun: 1, Usage: billed(2), UsageUnknown: 1}); counts != want {
			t.Errorf("Run() counts = %+v, want %+v", counts, want)
		}
		if last, ok := rec.notRun["busy"]; !ok || !errors.As(last, new(*llmretry.Cancelled)) {
			t.Errorf("OnNotRun got %v (%T), %t for busy; want a *Cancelled", last, last, ok)
		}
		if d, ok := rec.dead["cut"]; !ok || d.Runs != 1 {
			t.Errorf("dead letter for cut = %+v, %t; want one after 1 run", d, ok)
		}
		if diff := cmp.Diff([]time.Duration{0, 2 * time.Second}, f.runs["busy"]); diff != "" {
			t.Errorf("run times of busy (-want +got):\n%s", diff)
		}
	})
}

// A nil iterator is an empty batch.
func TestNilItems(t *testing.T) {
	var rec record
	counts, err := rec.runner(newFake(0, nil).chain()).Run(context.Background(), nil)
	if counts != (batch.Counts{}) || err != nil {
		t.Errorf("Run(nil) = %+v, %v, want no counts, nil", counts, err)
	}
}

// A backend that runs an inner chain twice per call is billed for both
// runs, and the batch's counts add up what every call cost: the inner
// chains' attempts once each, failed runs included.
func TestCountsUsageOfNestedChains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		each := llmretry.Usage{InputTokens: 10, OutputTokens: 1}
		inner := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
			Model: "inner",
			Call: func(ctx context.Context, id string) (string, error) {
				llmretry.ReportUsage(ctx, each)
				return "inner " + id, nil
			},
		}}}
		var runs sync.Map // item ID → runs so far
		outer := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
			Model: "outer",
			Call: func(ctx context.Context, id string) (string, error) {
				for range 2 {
					if _, err := inner.Do(ctx, id); err != nil {
						return "", err
					}
				}
				n, _ := runs.LoadOrStore(id, new(atomic.Int32))
				if id == "fails" && n.(*atomic.Int32).Add(1) < 3 {
					return "", overloaded
				}
				return "answer " + id, nil
			},
		}}}
		var rec record
		r := rec.runner(outer)
		r.Waits = []time.Duration{time.Second}
		counts, err := r.Run(context.Background(), items("a", "b", "fails"))
		if err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
		// a and b one call each, fails three: five calls, two inner runs each.
		want := batch.Counts{Succeeded: 3, Usage: llmretry.Usage{InputTokens: 100, OutputTokens: 10}}
		if d := cmp.Diff(want, counts); d != "" {
			t.Errorf("Run() counts differ (-want +got):\n%s", d)
		}
	})
}
