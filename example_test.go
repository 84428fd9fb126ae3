package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmretry/llmretry"
)

// A provider that is down answers 503 twice; the chain retries it, then
// fails over to a second model, which answers.
func Example_fallback() {
	primary := func(ctx context.Context, prompt string) (string, error) {
		return "", llmretry.StatusFailure(http.StatusServiceUnavailable, nil, errors.New("upstream connect error"))
	}
	secondary := func(ctx context.Context, prompt string) (string, error) {
		return "echo: " + prompt, nil
	}
	chain := &llmretry.Chain[string, string]{
		Backends: []llmretry.Backend[string, string]{
			{Model: "gpt-4o", Call: primary, Retry: llmretry.Policy{Waits: []time.Duration{time.Millisecond}}},
			{Model: "claude-sonnet", Call: secondary},
		},
		OnAttempt: func(ctx context.Context, a llmretry.Attempt) {
			fmt.Println(a)
		},
	}

	answer, err := chain.Do(context.Background(), "hello")
	fmt.Println(answer, err)
	// Output:
	// [backend 0 gpt-4o try 1] http 503: upstream connect error (retrying in 1ms)
	// [backend 0 gpt-4o try 2] http 503: upstream connect error (failing over: waits_used)
	// [backend 1 claude-sonnet try 1] ok
	// echo: hello <nil>
}

// Handlers match the narrow types first: Truncated and TimedOut are
// Exhausted errors too, and Cancelled is none of them.
func Example_catching() {
	describe := func(err error) string {
		var (
			cancelled *llmretry.Cancelled
			truncated *llmretry.Truncated
			timedOut  *llmretry.TimedOut
			exhausted *llmretry.Exhausted
		)
		switch {
		case errors.As(err, &cancelled):
			return "the caller withdrew; clean up quietly"
		case errors.As(err, &truncated):
			// Truncated attempts keep the partial output.
			return fmt.Sprintf("cut off at the budget after %q: raise max tokens", *truncated.Attempts[0].RawText)
		case errors.As(err, &timedOut):
			return "ran out of time: raise the deadline"
		case errors.As(err, &exhausted):
			return fmt.Sprintf("all backends failed, %d attempts", len(exhausted.Attempts))
		}
		return "not a chain error"
	}

	run := func(ctx context.Context, fail error) error {
		chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{{
			Model: "gpt-4o",
			Call:  func(ctx context.Context, prompt string) (string, error) { return "", fail },
		}}}
		_, err := chain.Do(ctx, "summarise the report")
		return err
	}

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	fmt.Println(describe(run(cancelled, nil)))
	fmt.Println(describe(run(context.Background(), llmretry.Truncation(`{"summary": "The rep`))))
	fmt.Println(describe(run(context.Background(), context.DeadlineExceeded)))
	fmt.Println(describe(run(context.Background(), llmretry.StatusFailure(http.StatusBadRequest, nil, nil))))
	// Output:
	// the caller withdrew; clean up quietly
	// cut off at the budget after "{\"summary\": \"The rep": raise max tokens
	// ran out of time: raise the deadline
	// all backends failed, 1 attempts
}

// A job-queue worker asks RetryItem whether a failed item deserves another
// run or belongs in the dead-letter queue.
func ExampleRetryItem() {
	route := func(err error) string {
		switch {
		case err == nil:
			return "done"
		case llmretry.RetryItem(err):
			return "requeue"
		}
		return "dead letter"
	}

	outage := llmretry.Exhaust([]llmretry.Attempt{{Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient,
		Err: llmretry.StatusFailure(http.StatusBadGateway, nil, nil)}})
	truncated := llmretry.Exhaust([]llmretry.Attempt{{Model: "gpt-4o", Try: 1, Kind: llmretry.KindTruncated,
		Err: llmretry.Truncation("Once upon a")}})
	broken := (&llmretry.Chain[string, string]{}).Validate()

	fmt.Println(route(nil))
	fmt.Println(route(outage))
	fmt.Println(route(fmt.Errorf("item 42: %w", truncated)))
	fmt.Println(route(broken))
	// Output:
	// done
	// requeue
	// dead letter
	// dead letter
}

// A streaming backend calls Delivered once the first chunk reaches the
// caller. A failure after that is not sent again, and no other backend is
// tried: the caller already holds part of the answer.
func ExampleDelivered() {
	var out []string
	calls := 0
	stream := func(ctx context.Context, prompt string) (string, error) {
		calls++
		out = append(out, "Hello")
		llmretry.Delivered(ctx)
		return "", llmretry.StatusFailure(http.StatusBadGateway, nil, errors.New("stream reset"))
	}
	chain := &llmretry.Chain[string, string]{Backends: []llmretry.Backend[string, string]{
		{Model: "gpt-4o", Call: stream, Retry: llmretry.Policy{Waits: []time.Duration{0, 0}}},
		{Model: "claude-sonnet", Call: func(ctx context.Context, prompt string) (string, error) { return "unused", nil }},
	}}

	_, err := chain.Do(context.Background(), "hi")
	var exhausted *llmretry.Exhausted
	if errors.As(err, &exhausted) {
		fmt.Println(calls, out, exhausted.Attempts[0].Delivered)
	}
	// Output:
	// 1 [Hello] true
}

// Exhausted's message is written for people: the lever first, then one
// line per attempt.
func ExampleExhausted_Error() {
	raw := `{"answer": 4`
	err := llmretry.Exhaust([]llmretry.Attempt{
		{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient,
			Err: llmretry.StatusFailure(http.StatusInternalServerError, nil, errors.New("upstream on fire"))},
		{Backend: 1, Model: "claude-sonnet", Try: 1, Kind: llmretry.KindTruncated,
			Err: llmretry.Truncation(raw), RawText: &raw},
	})
	fmt.Println(err)
	// Output:
	// llmretry: truncated after 2 attempts on 2 backends: raise the completion budget (max tokens)
	// 	[backend 0 gpt-4o try 1] http 500: upstream on fire
	// 	[backend 1 claude-sonnet try 1] truncated
}

// A dead-letter queue keeps the error as one JSON record, with json.Marshal:
// the outcome, the advice, the summary and every attempt. These records are
// what a chain over two providers that both refuse an over-long prompt
// returns.
func ExampleExhausted_MarshalJSON() {
	start := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	tooLong := errors.New("context_length_exceeded: maximum context length is 128000 tokens")
	err := llmretry.Exhaust([]llmretry.Attempt{
		{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindRejected, Status: 400,
			Err: llmretry.StatusFailure(400, nil, tooLong), Start: start, Elapsed: 180 * time.Millisecond,
			Next: llmretry.NextFailOver, Why: llmretry.WhyNotRetryable},
		{Backend: 1, Model: "claude-sonnet", Try: 1, Kind: llmretry.KindRejected, Status: 400,
			Err: llmretry.StatusFailure(400, nil, errors.New("prompt is too long")), Start: start.Add(180 * time.Millisecond), Elapsed: 95 * time.Millisecond,
			Next: llmretry.NextStop, Why: llmretry.WhyNotRetryable},
	})
	fmt.Println("retry the item:", llmretry.RetryItem(err))
	record, _ := json.MarshalIndent(err, "", "  ")
	fmt.Println(string(record))
	// Output:
	// retry the item: false
	// {
	//   "outcome": "exhausted",
	//   "item_retryable": false,
	//   "error": "llmretry: exhausted after 2 attempts on 2 backends: every backend rejected this request; change the request, since running it again will not help\n\t[backend 0 gpt-4o try 1] http 400: context_length_exceeded: maximum context length is 128000 tokens (failing over: not_retryable)\n\t[backend 1 claude-sonnet try 1] http 400: prompt is too long (stopping: not_retryable)",
	//   "usage_unknown": 0,
	//   "attempts": [
	//     {
	//       "backend": 0,
	//       "model": "gpt-4o",
	//       "try": 1,
	//       "kind": "rejected",
	//       "status": 400,
	//       "error": "http 400: context_length_exceeded: maximum context length is 128000 tokens",
	//       "start": "2026-11-30T09:00:00Z",
	//       "elapsed_ms": 180,
	//       "next": "fail_over",
	//       "why": "not_retryable",
	//       "retry_in_ms": 0,
	//       "delivered": false
	//     },
	//     {
	//       "backend": 1,
	//       "model": "claude-sonnet",
	//       "try": 1,
	//       "kind": "rejected",
	//       "status": 400,
	//       "error": "http 400: prompt is too long",
	//       "start": "2026-11-30T09:00:00.18Z",
	//       "elapsed_ms": 95,
	//       "next": "stop",
	//       "why": "not_retryable",
	//       "retry_in_ms": 0,
	//       "delivered": false
	//     }
	//   ]
	// }
}

// A job queue asks first whether an item may run again at all, then when:
// here both providers answered 429 and said when to come back, so the item
// is snoozed until the sooner of the two instead of spending an attempt.
func ExampleRetryItemAfter() {
	tenSecondsAgo := time.Now().Add(-10 * time.Second)
	err := llmretry.Exhaust([]llmretry.Attempt{
		{Backend: 0, Model: "gpt-4o", Kind: llmretry.KindTransient, Status: 429, Start: tenSecondsAgo, RetryAfter: 30 * time.Second},
		{Backend: 1, Model: "claude-sonnet", Kind: llmretry.KindTransient, Status: 429, Start: tenSecondsAgo, RetryAfter: 60 * time.Second},
	})
	if !llmretry.RetryItem(err) {
		fmt.Println("dead letter")
		return
	}
	if d, ok := llmretry.RetryItemAfter(err); ok {
		fmt.Println("snooze for", d.Round(time.Second))
	}
	// Output:
	// snooze for 20s
}
