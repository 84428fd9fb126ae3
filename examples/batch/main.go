// Command batch runs 1,000 items through a llmretry.Chain with the batch
// runner, over real HTTP on loopback, in a few seconds, while the
// providers misbehave as scripted:
//
//   - the primary (an OpenAI-compatible llmretrytest server) has an outage
//     from 2s to 5s: every request gets 503 with retry-after 2;
//   - the fallback (an Anthropic-compatible one) rate-limits every fourth
//     request it gets: 429 with retry-after 1;
//   - 25 items ask for an answer longer than the token budget, and are
//     cut off every time, on both providers;
//   - 10 items hit a bug on both providers, 500 every time.
//
// The runner routes each failure by the chain's advice. A truncated item
// goes to the dead letters at once, since no re-run can help. An item
// that met the outage and then the rate limit is run again when the
// providers said they would take work again (llmretry.RetryItemAfter),
// holding no concurrency slot meanwhile; the chain itself does not wait
// out a hint longer than its MaxWait, so it never parks a slot. An item
// that keeps failing is run three times, after the runner's own waits,
// and then goes to the dead letters.
//
// A progress line shows the counts as they change (updated in place on a
// terminal, a plain line every second otherwise). The dead letters go, one
// JSON object per line, to the file that -dead names, or by default to
// dead-letters.jsonl in a new temporary folder, whose path the program
// prints: the item's ID, why it is dead, its runs, and the chain's record
// of each run. At the end the program prints the counts. Ctrl-C stops the
// batch: the items cut short are counted as not run, never as dead.
//
//	go run ./examples/batch [-dead file]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/batch"
	"github.com/llmretry/llmretry/llmretrytest"
)

const (
	items        = 1000
	primaryModel = "gpt-4o"
	fallbackName = "claude-sonnet-4-5"
	deadFile     = "dead-letters.jsonl" // the file's name in the temporary folder
	outageStart  = 2 * time.Second
	outageEnd    = 5 * time.Second
	answerTime   = 80 * time.Millisecond // how long a scripted model takes to answer
)

func main() {
	dead := flag.String("dead", "", "the file to write the dead letters to (default: "+deadFile+" in a new temporary folder)")
	flag.Parse()
	path, err := deadPath(*dead)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Ctrl-C cancels the batch; the runner then counts the items it cut
	// short as not run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fi, err := os.Stdout.Stat()
	terminal := err == nil && fi.Mode()&os.ModeCharDevice != 0
	if _, err := run(ctx, os.Stdout, terminal, path); err != nil {
		fmt.Fprintln(os.Stderr, err) // the runner's errors say where they come from, "llmretry: batch: "
		os.Exit(1)
	}
}

// request is one item's prompt. Part is the part the item plays in the
// demo: "" for an ordinary item, "-long" for one whose answer never fits
// the budget, "-broken" for one that fails on every provider.
// llmretrytest scripts its answers per model, so the backends append Part
// to the model name and each part gets a script of its own; a real
// program would send the model name alone.
type request struct {
	Prompt string
	Part   string
}

// part is the part item i (from 1) plays.
func part(i int) string {
	switch {
	case i%40 == 7:
		return "-long" // 25 items
	case i%100 == 50:
		return "-broken" // 10 items
	}
	return ""
}

// deadPath is the file the dead letters go to: dead when it is set, and
// otherwise deadFile in a new temporary folder, so that a demo run leaves
// nothing in the directory it was started in.
func deadPath(dead string) (string, error) {
	if dead != "" {
		return dead, nil
	}
	dir, err := os.MkdirTemp("", "llmretry-batch-")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, deadFile), nil
}

// run plays the demo, writes what happens to w and the dead letters to
// the file deadPath, and returns the counts. terminal says whether w is a
// terminal, where the progress line is updated in place. The error is for
// a demo that could not run, or was interrupted.
func run(ctx context.Context, w io.Writer, terminal bool, deadPath string) (batch.Counts, error) {
	return play(ctx, w, terminal, deadPath, nil)
}

// play is run, handing each dead letter to keep too when it is not nil,
// as the runner gave it to the file, so that a test can compare the file
// with what was written to it.
func play(ctx context.Context, w io.Writer, terminal bool, deadPath string, keep func(batch.DeadLetter)) (batch.Counts, error) {
	primary := llmretrytest.NewServer()
	defer primary.Close()
	fallback := llmretrytest.NewServer()
	defer fallback.Close()
	script(primary, fallback)

	f, err := os.Create(deadPath)
	if err != nil {
		return batch.Counts{}, err
	}
	defer f.Close()

	var sent [2]atomic.Int64 // requests per provider, for the progress line
	chain := &llmretry.Chain[request, llmretry.Completion]{
		Backends: []llmretry.Backend[request, llmretry.Completion]{
			{
				Model: primaryModel,
				Call:  openAIChat(primary.OpenAIBaseURL()+"chat/completions", primaryModel, &sent[0]),
				Retry: llmretry.Policy{
					Waits: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
					// The outage's retry-after 2 is longer than this, so
					// the chain fails over at once instead of holding
					// the item's slot for two seconds.
					MaxWait: time.Second,
				},
				Timeout: 5 * time.Second,
			},
			{
				Model: fallbackName,
				Call:  anthropicMessages(fallback.AnthropicBaseURL()+"v1/messages", fallbackName, &sent[1]),
				Retry: llmretry.Policy{
					Waits: []time.Duration{100 * time.Millisecond},
					// Likewise for the rate limit's retry-after 1: the
					// runner waits it out, with the slot free.
					MaxWait: 500 * time.Millisecond,
				},
				Timeout: 5 * time.Second,
			},
		},
	}

	// What the dead letters were, for the summary, on their way to the
	// file.
	var outcomes sync.Map // outcome → *atomic.Int64
	sink := batch.JSONLines(f)
	var runs atomic.Int64
	chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) {
		if a.Backend == 0 && a.Try == 1 {
			runs.Add(1) // every run starts at the first backend
		}
	}

	var latest atomic.Pointer[batch.Counts]
	latest.Store(&batch.Counts{})
	r := &batch.Runner[request, llmretry.Completion]{
		Chain:       chain,
		Concurrency: 16,
		Runs:        3,
		// Scaled down so the demo takes seconds; think minutes in
		// production.
		Waits: []time.Duration{500 * time.Millisecond, time.Second},
		Dead: batch.SinkFunc(func(d batch.DeadLetter) error {
			n, _ := outcomes.LoadOrStore(outcome(d.Err), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			if keep != nil {
				keep(d) // the runner calls its Sink from one goroutine at a time
			}
			return sink.Put(d)
		}),
		OnProgress: func(c batch.Counts) { latest.Store(&c) },
	}

	fmt.Fprintf(w, "%d items, %d at a time, up to %d runs each, through two scripted providers on loopback:\n", items, r.Concurrency, r.Runs)
	fmt.Fprintf(w, "  primary   %-18s OpenAI API     down from %v to %v (503, retry-after 2)\n", primaryModel, outageStart, outageEnd)
	fmt.Fprintf(w, "  fallback  %-18s Anthropic API  429 with retry-after 1 on every 4th request\n", fallbackName)
	fmt.Fprintln(w, "25 items are cut off at max_tokens every time; 10 fail with 500 everywhere.")
	fmt.Fprintf(w, "Dead letters go to %s.\n", deadPath)
	fmt.Fprintln(w)

	// On a terminal the progress line is rewritten in place: back to the
	// start of the line, the line, then clear what is left of the old one.
	start := time.Now()
	every, begin, end := time.Second, "", "\n"
	if terminal {
		every, begin, end = 100*time.Millisecond, "\r", "\x1b[K"
	}
	// Short enough for an 80-column terminal, where a wrapped line could
	// not be rewritten in place.
	fmt.Fprintln(w, "  time  ended    ok  dead  not run  primary (requests)  fallback (requests)")
	progress := func() {
		c := *latest.Load()
		state := "up"
		if e := time.Since(start); e >= outageStart && e < outageEnd {
			state = "DOWN"
		}
		fmt.Fprintf(w, "%s%5.1fs%7d%6d%6d%9d  %-4s%14d%21d%s",
			begin, time.Since(start).Seconds(), c.Total(), c.Succeeded, c.Dead, c.NotRun,
			state, sent[0].Load(), sent[1].Load(), end)
	}
	// The outage, and the progress line, run beside the batch; both end
	// before run returns.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { outage(primary, start, done) })
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				progress()
			}
		}
	})

	counts, runErr := r.Run(ctx, prompts())
	close(done)
	wg.Wait()
	progress()
	if terminal {
		fmt.Fprintln(w)
	}
	if err := f.Close(); err != nil && runErr == nil {
		runErr = err
	}

	fmt.Fprintf(w, "\nDone in %.1fs: %d succeeded, %d dead, %d not run (%d items); %d runs in all.\n",
		time.Since(start).Seconds(), counts.Succeeded, counts.Dead, counts.NotRun, counts.Total(), runs.Load())
	fmt.Fprintf(w, "Billed, as the providers reported it: %d tokens in, %d out, dead items included; %d attempts of unknown cost.\n",
		counts.Usage.InputTokens, counts.Usage.OutputTokens, counts.UsageUnknown)
	fmt.Fprintf(w, "%d dead letters written to %s, one JSON object per line:\n", counts.Dead, deadPath)
	fmt.Fprintln(w, "the item's id, why it is dead, its runs, and the chain's record of each run, attempt by attempt.")
	for _, o := range []string{"truncated", "exhausted", "timed_out", "other"} {
		if n, ok := outcomes.Load(o); ok {
			fmt.Fprintf(w, "  %-9s %3d  %s\n", o, n.(*atomic.Int64).Load(), lever[o])
		}
	}
	if counts.NotRun > 0 {
		fmt.Fprintf(w, "%d items were cut short by the interrupt and not run: run them again.\n", counts.NotRun)
	}
	fmt.Fprintf(w, "To see which items are worth running again, and when:\n  go run ./cmd/llmretry deadletters %s\n", deadPath)
	return counts, runErr
}

// lever says what to do about each kind of dead letter.
var lever = map[string]string{
	"truncated": "cut off at max_tokens on every backend: raise the budget; re-runs cannot help",
	"exhausted": "every backend failed on every run: see the attempts",
	"timed_out": "ran out of time: raise the timeouts",
	"other":     "not the chain's error",
}

// outcome names a dead letter's error as its JSON record does.
func outcome(err error) string {
	var (
		truncated *llmretry.Truncated
		timedOut  *llmretry.TimedOut
		exhausted *llmretry.Exhausted
	)
	switch {
	case errors.As(err, &truncated):
		return "truncated"
	case errors.As(err, &timedOut):
		return "timed_out"
	case errors.As(err, &exhausted):
		return "exhausted"
	}
	return "other"
}

// prompts yields the items, "ticket-0001" to "ticket-1000".
func prompts() iter.Seq[batch.Item[request]] {
	return func(yield func(batch.Item[request]) bool) {
		for i := 1; i <= items; i++ {
			id := fmt.Sprintf("ticket-%04d", i)
			if !yield(batch.Item[request]{ID: id, Req: request{Prompt: "Summarise support " + id + " in one line.", Part: part(i)}}) {
				return
			}
		}
	}
}

// healthy is what each part's model answers while its provider is up:
// an answer, an answer cut off at the budget, or a 500.
func healthy() map[string]llmretrytest.Step {
	return map[string]llmretrytest.Step{
		"":        llmretrytest.Answer("The customer cannot log in after the update; a password reset fixed it.").After(answerTime),
		"-long":   llmretrytest.Truncated("The customer reports, at length, that").After(answerTime),
		"-broken": llmretrytest.Status(500).After(answerTime),
	}
}

// script sets up both providers: the answers, the long and broken items'
// parts, and the fallback's rate limit.
func script(primary, fallback *llmretrytest.Server) {
	for part, step := range healthy() {
		primary.Script(primaryModel+part, step)
		fallback.Script(fallbackName+part, step)
	}
	// A script's last step repeats, so the rate limit's cycle is spelled
	// out for more requests than the fallback will get.
	answer := healthy()[""]
	limited := llmretrytest.Status(429).WithHeader("retry-after", "1")
	var cycle []llmretrytest.Step
	for range 2000 {
		cycle = append(cycle, answer, answer, answer, limited)
	}
	fallback.Script(fallbackName, cycle...)
}

// outage takes the primary down (every request 503 with retry-after 2)
// from outageStart to outageEnd after start, or until done is closed.
func outage(primary *llmretrytest.Server, start time.Time, done <-chan struct{}) {
	wait := func(until time.Duration) bool {
		t := time.NewTimer(time.Until(start.Add(until)))
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-done:
			return false
		}
	}
	if !wait(outageStart) {
		return
	}
	for part := range healthy() {
		primary.Script(primaryModel+part, llmretrytest.Status(503).WithHeader("retry-after", "2"))
	}
	if !wait(outageEnd) {
		return
	}
	for part, step := range healthy() {
		primary.Script(primaryModel+part, step)
	}
}

// openAIChat returns a backend Call for an OpenAI-compatible Chat
// Completions endpoint at url, counting its requests in sent.
func openAIChat(url, model string, sent *atomic.Int64) func(context.Context, request) (llmretry.Completion, error) {
	return func(ctx context.Context, req request) (llmretry.Completion, error) {
		sent.Add(1)
		resp, body, err := post(ctx, url, nil, map[string]any{
			"model":      model + req.Part,
			"max_tokens": 256,
			"messages":   []map[string]string{{"role": "user", "content": req.Prompt}},
		})
		if err != nil {
			return llmretry.Completion{}, err // Classify knows refused and dropped connections
		}
		var out struct {
			Model   string `json:"model"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		decodeErr := json.Unmarshal(body, &out)
		if resp.StatusCode >= 400 {
			// Reads retry-after, and classifies the status.
			return llmretry.Completion{}, llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(message(out.Error.Message, resp)))
		}
		if decodeErr != nil || len(out.Choices) == 0 {
			return llmretry.Completion{}, llmretry.ParseFailure(string(body), fmt.Errorf("no answer in the response: %v", decodeErr))
		}
		choice := out.Choices[0]
		usage := llmretry.Usage{InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens}
		if choice.FinishReason == "length" {
			cut := llmretry.Truncation(choice.Message.Content) // the partial text is kept in the record
			cut.Usage = &usage                                 // and what it was billed
			return llmretry.Completion{}, cut
		}
		llmretry.ReportUsage(ctx, usage)
		return llmretry.Completion{
			Model: out.Model, Text: choice.Message.Content, StopReason: choice.FinishReason,
			InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens,
		}, nil
	}
}

// anthropicMessages returns a backend Call for an Anthropic-compatible
// Messages endpoint at url, counting its requests in sent.
func anthropicMessages(url, model string, sent *atomic.Int64) func(context.Context, request) (llmretry.Completion, error) {
	header := http.Header{
		"X-Api-Key":         {"test"}, // the scripted server checks no key
		"Anthropic-Version": {"2023-06-01"},
	}
	return func(ctx context.Context, req request) (llmretry.Completion, error) {
		sent.Add(1)
		resp, body, err := post(ctx, url, header, map[string]any{
			"model":      model + req.Part,
			"max_tokens": 256,
			"messages":   []map[string]string{{"role": "user", "content": req.Prompt}},
		})
		if err != nil {
			return llmretry.Completion{}, err
		}
		var out struct {
			Model   string `json:"model"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			StopReason string `json:"stop_reason"`
			Usage      struct {
				InputTokens  int64 `json:"input_tokens"`
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		decodeErr := json.Unmarshal(body, &out)
		if resp.StatusCode >= 400 {
			return llmretry.Completion{}, llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(message(out.Error.Message, resp)))
		}
		if decodeErr != nil {
			return llmretry.Completion{}, llmretry.ParseFailure(string(body), fmt.Errorf("no answer in the response: %v", decodeErr))
		}
		var text strings.Builder
		for _, block := range out.Content {
			if block.Type == "text" {
				text.WriteString(block.Text)
			}
		}
		usage := llmretry.Usage{InputTokens: out.Usage.InputTokens, OutputTokens: out.Usage.OutputTokens}
		if out.StopReason == "max_tokens" {
			cut := llmretry.Truncation(text.String())
			cut.Usage = &usage
			return llmretry.Completion{}, cut
		}
		llmretry.ReportUsage(ctx, usage)
		return llmretry.Completion{
			Model: out.Model, Text: text.String(), StopReason: out.StopReason,
			InputTokens: out.Usage.InputTokens, OutputTokens: out.Usage.OutputTokens,
		}, nil
	}
}

// client has no Timeout of its own: each backend's Timeout reaches the
// request through its context.
var client = &http.Client{}

// post sends in as JSON and returns the response with its body read.
func post(ctx context.Context, url string, header http.Header, in any) (*http.Response, []byte, error) {
	data, err := json.Marshal(in)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	if header != nil {
		req.Header = header.Clone()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, err // a body cut off midway is an unexpected EOF: retried
	}
	return resp, body, nil
}

// message is the provider's error message, or the status text when the
// body had none.
func message(msg string, resp *http.Response) string {
	if msg == "" {
		return http.StatusText(resp.StatusCode)
	}
	return msg
}
