// Command outage shows a llmretry.Chain getting an answer through a
// provider outage, over real HTTP on loopback, in a few seconds.
//
// Two scripted providers (llmretrytest servers on 127.0.0.1) stand in for
// the real ones: an OpenAI-compatible primary that answers 503, 503, 429
// with retry-after 1 and then goes down, and an Anthropic-compatible
// secondary. The chain retries the primary, fails over to the secondary,
// and, when the secondary's answer is cut off at its token budget, to the
// same model with a larger budget. The program prints every attempt as a
// row of a timeline, then the answer.
//
// Then comes an item that fails everywhere, and the program prints what a
// job queue would act on: the typed error, the advice whether re-running
// the item could help, and the JSON record a dead-letter queue keeps.
//
// The backends are plain net/http: a small function per provider API.
// The primary's URL carries a fake API key in its query, as some
// providers take it; nothing the program prints shows it.
//
//	go run ./examples/outage
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// fakeKey looks like a real key on purpose: Redact must hide it wherever
// it could leak, here in the URLs that net/http puts in its errors.
const fakeKey = "sk-test-outage-demo-0123456789abcdef"

const (
	primaryModel   = "gpt-4o"
	secondaryModel = "claude-sonnet-4-5"
	smallBudget    = 64   // max_tokens on the first try at the secondary: cheap, and often enough
	largeBudget    = 1024 // max_tokens when the small budget cut the answer off
)

const prompt = "In one sentence: why do retries need jitter?"

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "outage:", err)
		os.Exit(1)
	}
}

// run plays both parts of the demo and writes what happens to w. It
// returns an error only when the demo did not go as scripted.
func run(w io.Writer) error {
	// Two providers of different APIs: an outage seldom hits two vendors
	// at once, so the fallback that helps is one on another provider,
	// and one Chain can hold both because every backend returns the
	// same llmretry.Completion.
	primary := llmretrytest.NewServer()
	defer primary.Close()
	secondary := llmretrytest.NewServer()
	defer secondary.Close()

	primaryURL := primary.OpenAIBaseURL() + "chat/completions?key=" + fakeKey
	secondaryURL := secondary.AnthropicBaseURL() + "v1/messages"

	tl := &timeline{w: w, names: []string{"0 primary", "1 secondary", "2 secondary"}}
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{
			{
				Model: primaryModel,
				Call:  openAIChat(primaryURL, primaryModel, largeBudget),
				Retry: llmretry.Policy{
					// Four retries, scaled down so the demo takes
					// seconds; in production think 1s, 2s, 4s, 8s with
					// Jitter 0.2, so that many clients do not retry in
					// step. The context below has no deadline, so this
					// list is the bound: after the fifth failure the
					// chain fails over.
					Waits: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond},
					// A server's retry-after replaces a shorter wait. One
					// longer than this ends the backend's retries instead
					// of parking the caller.
					MaxWait: 2 * time.Second,
				},
				// Per attempt. Loopback answers in milliseconds; for a
				// real model allow a minute or more.
				Timeout: 2 * time.Second,
			},
			{
				Model:   secondaryModel,
				Call:    anthropicMessages(secondaryURL, secondaryModel, smallBudget),
				Retry:   llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond}},
				Timeout: 2 * time.Second,
			},
			{
				// The same model again with a larger budget. A truncated
				// answer is not retried in its own backend, because the
				// same request stops at the same place, so raising the
				// budget takes a backend of its own.
				Model:   secondaryModel,
				Call:    anthropicMessages(secondaryURL, secondaryModel, largeBudget),
				Retry:   llmretry.Policy{Waits: []time.Duration{100 * time.Millisecond}},
				Timeout: 2 * time.Second,
			},
		},
		// Called as each attempt ends, success included, with what the
		// chain does next already decided: the timeline's rows.
		OnAttempt: tl.row,
	}

	fmt.Fprintln(w, "Backends, in the order the chain tries them (loopback servers scripted by llmretrytest):")
	// Redact shows the key is in the URL, and that it stays hidden.
	fmt.Fprintf(w, "  0 primary    %-18s OpenAI API     max_tokens %-4d  %s\n", primaryModel, largeBudget, llmretry.Redact(primaryURL))
	fmt.Fprintf(w, "  1 secondary  %-18s Anthropic API  max_tokens %-4d  %s\n", secondaryModel, smallBudget, secondaryURL)
	fmt.Fprintf(w, "  2 secondary  %-18s Anthropic API  max_tokens %-4d  (the same model, for answers cut off at %d)\n", secondaryModel, largeBudget, smallBudget)

	// Part 1. The primary's outage, step by step: Down answers the request
	// that plays it with a closed connection (EOF) and stops the server
	// listening, so every later request is refused by the OS. The
	// secondary cuts its first answer off at the token budget.
	primary.Script(primaryModel,
		llmretrytest.Status(503),
		llmretrytest.Status(503),
		llmretrytest.Status(429).WithHeader("retry-after", "1"),
		llmretrytest.Down(),
	)
	answer := "Without jitter, clients that failed together retry together, so every retry wave hits the recovering server at the same instant."
	secondary.Script(secondaryModel,
		llmretrytest.Truncated("Without jitter, clients that failed together retry"),
		llmretrytest.Answer(answer),
	)

	fmt.Fprintln(w)
	fmt.Fprintln(w, "== Part 1: the primary has an outage (503, 503, 429 with retry-after: 1, then down); the chain fails over")
	tl.begin()
	got, err := chain.Do(context.Background(), prompt)
	if err != nil {
		return fmt.Errorf("part 1 should have been answered: %v", err) // the chain's errors redact themselves
	}
	fmt.Fprintf(w, "\nAnswer from %s (stop reason %q, %d tokens in, %d out):\n  %s\n",
		got.Model, got.StopReason, got.InputTokens, got.OutputTokens, got.Text)

	// The servers' logs show what the providers received. A refused
	// connection never reaches a server, so the primary saw fewer
	// requests than the chain made.
	fmt.Fprintln(w, "\nWhat the providers received (their own logs):")
	logged := steps(primary.Requests())
	fmt.Fprintf(w, "  primary    %d requests: %s\n", len(logged), strings.Join(logged, ", "))
	if refused := tl.tries[0] - len(logged); refused > 0 {
		fmt.Fprintf(w, "             and %d more from the chain, refused before reaching the server\n", refused)
	}
	logged = steps(secondary.Requests())
	fmt.Fprintf(w, "  secondary  %d requests: %s\n", len(logged), strings.Join(logged, ", "))

	// Part 2. The primary is still down, and this item's answer is longer
	// than even the larger budget, so every backend fails.
	secondary.Script(secondaryModel, llmretrytest.Truncated("A full comparison of backoff strategies starts with"))

	fmt.Fprintln(w)
	fmt.Fprintln(w, "== Part 2: an item that fails everywhere: the primary is still down, and the secondary cuts every answer off")
	tl.begin()
	_, itemErr := chain.Do(context.Background(), "Compare every backoff strategy you know, in depth.")
	if itemErr == nil {
		return errors.New("part 2 should have failed")
	}

	// err is one of the package's typed errors: *Truncated here, because
	// an attempt was cut off, and raising the budget is the fix. Its text
	// is a summary for people, one line per attempt, secrets redacted.
	fmt.Fprintln(w, "\nThe error, err.Error():")
	fmt.Fprintln(w, indent(itemErr.Error()))

	// RetryItem is what a job queue asks: would running this item again
	// help? A truncated answer would be cut off again at the same place.
	fmt.Fprintf(w, "\nThe advice, llmretry.RetryItem(err): %t", llmretry.RetryItem(itemErr))
	if llmretry.RetryItem(itemErr) {
		fmt.Fprintln(w, " (run the item again later)")
	} else {
		fmt.Fprintln(w, " (running it again would fail the same way: park it in a dead-letter queue)")
	}

	// The JSON encoding is the record to keep: the outcome, the advice,
	// and every attempt with its kind, status, timing and the model's raw
	// output, secrets redacted.
	record, err := json.MarshalIndent(itemErr, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the dead-letter record: %v", err)
	}
	fmt.Fprintln(w, "\nThe dead-letter record, json.MarshalIndent(err):")
	fmt.Fprintln(w, string(record))
	return nil
}

// timeline prints each attempt as a row of an aligned table. Rows are
// written as attempts end, so the waits can be watched as they happen;
// the columns have fixed widths for that reason (a tabwriter would hold
// every row until the end).
type timeline struct {
	w     io.Writer
	names []string // a label per backend, by index
	start time.Time
	tries map[int]int // attempts per backend in the current part
}

// rowFormat is the layout of the header and every row.
const rowFormat = "  %7s  %-11s  %-17s  %3s  %-9s  %6s  %-23s  %5s  %s\n"

// begin starts a new table, with times counted from now.
func (t *timeline) begin() {
	t.start = time.Now()
	t.tries = map[int]int{}
	fmt.Fprintln(t.w, "  time: when the attempt was sent; wait: the pause before the next try; error: as the backend returned it, redacted")
	fmt.Fprintf(t.w, rowFormat, "time", "backend", "model", "try", "kind", "status", "next/why", "wait", "error")
}

// row is the chain's OnAttempt: it runs on the goroutine of Do, so it
// needs no lock.
func (t *timeline) row(_ context.Context, a llmretry.Attempt) {
	t.tries[a.Backend]++
	kind, status, next, wait, msg := "ok", "-", "-", "-", "-"
	if a.Err != nil || a.Next != "" {
		kind = a.Kind.String()
	}
	if a.Status != 0 {
		status = fmt.Sprint(a.Status)
	}
	switch a.Next {
	case llmretry.NextRetry:
		next, wait = "retry", a.RetryIn.String()
	case llmretry.NextFailOver, llmretry.NextStop:
		next = string(a.Next) + "/" + string(a.Why)
	}
	if a.Err != nil {
		// OnAttempt gets the error as the backend returned it. net/http's
		// errors quote the URL, key and all, so redact before printing.
		msg = llmretry.Redact(a.Err.Error())
	}
	if a.RawText != nil {
		// The model's partial output is kept in the record, so a
		// truncated answer is not lost.
		msg += fmt.Sprintf(" (raw text kept: %q)", llmretry.Redact(*a.RawText))
	}
	at := fmt.Sprintf("%.3fs", a.Start.Sub(t.start).Seconds())
	fmt.Fprintf(t.w, rowFormat, at, t.names[a.Backend], a.Model, fmt.Sprint(a.Try), kind, status, next, wait, msg)
}

// openAIChat returns a backend Call for an OpenAI-compatible Chat
// Completions endpoint at url.
func openAIChat(url, model string, maxTokens int) func(context.Context, string) (llmretry.Completion, error) {
	return func(ctx context.Context, prompt string) (llmretry.Completion, error) {
		resp, body, err := post(ctx, url, nil, map[string]any{
			"model":      model,
			"max_tokens": maxTokens,
			"messages":   []map[string]string{{"role": "user", "content": prompt}},
		})
		if err != nil {
			return llmretry.Completion{}, err
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
			// StatusFailure classifies the status (429 and 5xx retried,
			// other 4xx fail over) and reads retry-after.
			return llmretry.Completion{}, llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(message(out.Error.Message, resp)))
		}
		if decodeErr != nil || len(out.Choices) == 0 {
			// Retried: a garbled answer is seldom garbled twice.
			return llmretry.Completion{}, llmretry.ParseFailure(string(body), fmt.Errorf("no answer in the response: %v", decodeErr))
		}
		// Every answer is billed, a truncated one too: the record says so.
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens})
		choice := out.Choices[0]
		switch {
		case choice.FinishReason == "length":
			// Keeps the partial text in the record.
			return llmretry.Completion{}, llmretry.Truncation(choice.Message.Content)
		case choice.Message.Content == "":
			return llmretry.Completion{}, llmretry.ParseFailure("", errors.New("empty answer"))
		}
		return llmretry.Completion{
			Model: out.Model, Text: choice.Message.Content, StopReason: choice.FinishReason,
			InputTokens: out.Usage.PromptTokens, OutputTokens: out.Usage.CompletionTokens,
		}, nil
	}
}

// anthropicMessages returns a backend Call for an Anthropic-compatible
// Messages endpoint at url.
func anthropicMessages(url, model string, maxTokens int) func(context.Context, string) (llmretry.Completion, error) {
	header := http.Header{
		"X-Api-Key":         {"test"}, // the scripted server checks no key
		"Anthropic-Version": {"2023-06-01"},
	}
	return func(ctx context.Context, prompt string) (llmretry.Completion, error) {
		resp, body, err := post(ctx, url, header, map[string]any{
			"model":      model,
			"max_tokens": maxTokens,
			"messages":   []map[string]string{{"role": "user", "content": prompt}},
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
		llmretry.ReportUsage(ctx, llmretry.Usage{InputTokens: out.Usage.InputTokens, OutputTokens: out.Usage.OutputTokens})
		var text strings.Builder
		for _, block := range out.Content {
			if block.Type == "text" {
				text.WriteString(block.Text)
			}
		}
		switch {
		case out.StopReason == "max_tokens":
			return llmretry.Completion{}, llmretry.Truncation(text.String())
		case text.Len() == 0:
			return llmretry.Completion{}, llmretry.ParseFailure("", errors.New("empty answer"))
		}
		return llmretry.Completion{
			Model: out.Model, Text: text.String(), StopReason: out.StopReason,
			InputTokens: out.Usage.InputTokens, OutputTokens: out.Usage.OutputTokens,
		}, nil
	}
}

// client has no Timeout of its own: the chain's per-attempt Timeout
// reaches the request through its context, and is then recorded as a
// timeout rather than as an unknown error.
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
		// Refused and dropped connections come back as they are:
		// llmretry.Classify knows them, and retries them.
		return nil, nil, err
	}
	defer resp.Body.Close()
	// A body cut off midway fails here with an unexpected EOF, which is
	// retried too. The limit keeps a broken server from filling memory.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, err
	}
	return resp, body, nil
}

// message is the provider's error message, or the status text when the
// body had none (a proxy's HTML error page, say).
func message(msg string, resp *http.Response) string {
	if msg == "" {
		return http.StatusText(resp.StatusCode)
	}
	return msg
}

// steps names the step each logged request played.
func steps(log []llmretrytest.Request) []string {
	names := make([]string, len(log))
	for i, r := range log {
		names[i] = r.Step
	}
	return names
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
