package main

import (
	"context"
	"fmt"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// One chain across three providers: OpenAI first, Anthropic when OpenAI
// gives up, Gemini when Anthropic does. All three answer a Completion, so
// the caller does not care which did. Scripted servers stand in for the
// APIs; against the real ones, build the clients with openai.NewClient(),
// anthropic.NewClient() and genai.NewClient without a BaseURL.
func Example_openAIFirst() {
	openaiAPI, anthropicAPI, geminiAPI := llmretrytest.NewServer(), llmretrytest.NewServer(), llmretrytest.NewServer()
	defer openaiAPI.Close()
	defer anthropicAPI.Close()
	defer geminiAPI.Close()
	openaiAPI.Script("gpt-4o", llmretrytest.Status(503))               // down, for good
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529)) // overloaded, for good
	geminiAPI.Script("gemini-2.5-flash", llmretrytest.Answer("Rayleigh scattering."))
	gem, err := geminiClient(context.Background(), geminiAPI.GeminiBaseURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	chain := newChain(
		openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-example")),
		anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-example")),
		gem,
	)
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Model+":", answer.Text, err)
	fmt.Println("requests to OpenAI:", len(openaiAPI.Requests()), "to Anthropic:", len(anthropicAPI.Requests()), "to Gemini:", len(geminiAPI.Requests()))
	// Output:
	// gemini-2.5-flash: Rayleigh scattering. <nil>
	// requests to OpenAI: 2 to Anthropic: 2 to Gemini: 1
}

// The other way round: Anthropic first, OpenAI when Anthropic gives up.
func Example_anthropicFirst() {
	anthropicAPI, openaiAPI := llmretrytest.NewServer(), llmretrytest.NewServer()
	defer anthropicAPI.Close()
	defer openaiAPI.Close()
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529)) // overloaded, for good
	openaiAPI.Script("gpt-4o", llmretrytest.Answer("Rayleigh scattering."))
	ant := anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-example"))
	oai := openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-example"))

	claude := anthropicretry.Messages(ant, "claude-sonnet-4-5", func(q string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(q))}}
	})
	claude.Retry = llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}} // seconds in production
	gpt := openairetry.Chat(oai, "gpt-4o", func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	})
	chain := &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{claude, gpt}}
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")

	fmt.Println(answer.Model+":", answer.Text, err)
	fmt.Println("requests to Anthropic:", len(anthropicAPI.Requests()), "to OpenAI:", len(openaiAPI.Requests()))
	// Output:
	// gpt-4o: Rayleigh scattering. <nil>
	// requests to Anthropic: 2 to OpenAI: 1
}
