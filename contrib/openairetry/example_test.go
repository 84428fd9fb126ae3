package openairetry_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// A chain over two OpenAI models: gpt-4o is retried after a 503, and
// gpt-4o-mini would answer if gpt-4o gave up. A scripted server stands in
// for OpenAI; against the real API, build the client with
// openai.NewClient() alone.
func Example() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gpt-4o", llmretrytest.Status(503), llmretrytest.Answer("Rayleigh scattering."))
	client := openai.NewClient(option.WithBaseURL(srv.OpenAIBaseURL()), option.WithAPIKey("sk-example"))

	ask := func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	}
	gpt := openairetry.Chat(client, "gpt-4o", ask)
	gpt.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{gpt, openairetry.Chat(client, "gpt-4o-mini", ask)},
	}
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Text, answer.Model, err)
	for _, r := range srv.Requests() {
		fmt.Println(r.Model, r.Step)
	}
	// Output:
	// Rayleigh scattering. gpt-4o <nil>
	// gpt-4o status 503
	// gpt-4o answer
}

// A streaming backend hands the text to emit as it arrives. A stream that
// breaks after that is not sent again: the chain returns the error at
// once, with the text in its record.
func ExampleChatStream() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gpt-4o", llmretrytest.Answer("Rayleigh scattering."))
	client := openai.NewClient(option.WithBaseURL(srv.OpenAIBaseURL()), option.WithAPIKey("sk-example"))

	ask := func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	}
	emit := func(_ string, delta string) { fmt.Printf("%q\n", delta) }
	gpt := openairetry.ChatStream(client, "gpt-4o", ask, emit)
	gpt.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{gpt}}
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Text, answer.StopReason, answer.OutputTokens, err)
	// Output:
	// "Rayleigh "
	// "scattering."
	// Rayleigh scattering. stop 2 <nil>
}

// A Responses API backend holds its answer when it streams with a nil
// emit: a stream cut before it finished has reached no one, so it is sent
// again, and the caller gets the whole answer.
func ExampleResponsesStream() {
	srv := llmretrytest.NewServer()
	defer srv.Close()
	srv.Script("gpt-4o", llmretrytest.StreamDrop(1), llmretrytest.Answer("Rayleigh scattering."))
	client := openai.NewClient(option.WithBaseURL(srv.OpenAIBaseURL()), option.WithAPIKey("sk-example"))

	ask := func(q string) responses.ResponseNewParams {
		return responses.ResponseNewParams{Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(q)}}
	}
	gpt := openairetry.ResponsesStream(client, "gpt-4o", ask, nil)
	gpt.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}}
	chain := &llmretry.Chain[string, llmretry.Completion]{
		Backends: []llmretry.Backend[string, llmretry.Completion]{gpt},
		OnAttempt: func(_ context.Context, a llmretry.Attempt) {
			if a.Err != nil {
				fmt.Println("try", a.Try, a.Kind, "delivered:", a.Delivered)
				return
			}
			fmt.Printf("try %d answered, %d tokens in, %d out\n", a.Try, a.Usage.InputTokens, a.Usage.OutputTokens)
		},
	}
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Text, answer.StopReason, err)
	// Output:
	// try 1 transient delivered: false
	// try 2 answered, 10 tokens in, 2 out
	// Rayleigh scattering. completed <nil>
}

// A pool serves gpt-4o from two projects' keys, balanced by the headroom
// each reports, and from a pay-as-you-go deployment that takes only what
// the two cannot take now; each deployment has a Breaker of its own on
// the fleet's store. This is the README's pool, only compiled, as it
// calls OpenAI.
func Example_pool() {
	ctx := context.Background()
	store := &llmretrytest.MemoryStore{} // a fleet's: pgbreaker.New(pool)
	build := func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	}
	deployment := func(name, key string, tier int) llmretry.Deployment[string, llmretry.Completion] {
		b := openairetry.Chat(openai.NewClient(option.WithAPIKey(key)), "gpt-4o", build)
		b.Breaker = &llmretry.Breaker{Store: store, Key: "openai/" + name} // its health and headroom, the fleet's
		return llmretry.Deployment[string, llmretry.Completion]{Name: name, Backend: b, Tier: tier}
	}
	gpt := llmretry.Backend[string, llmretry.Completion]{
		Model: "gpt-4o",
		Pool: []llmretry.Deployment[string, llmretry.Completion]{
			deployment("project-a", os.Getenv("OPENAI_KEY_A"), 0), // two keys, balanced by headroom
			deployment("project-b", os.Getenv("OPENAI_KEY_B"), 0),
			deployment("paygo", os.Getenv("OPENAI_KEY_PAYGO"), 1), // spillover: what tier 0 cannot take now
		},
		Retry: llmretry.Policy{Waits: []time.Duration{time.Second, 4 * time.Second}},
	}
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{gpt}}
	answer, err := chain.Do(ctx, "Why is the sky blue?")
	fmt.Println(answer.Text, err)
}
