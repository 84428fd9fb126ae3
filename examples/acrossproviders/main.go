// Command acrossproviders runs one chain across three providers: OpenAI
// first, Anthropic when OpenAI gives up, Gemini when Anthropic does. The
// three adapters answer with an llmretry.Completion, so the caller does not
// care which one did. Three scripted servers (llmretrytest) stand in for
// the APIs; against the real ones, build the clients with
// openai.NewClient(), anthropic.NewClient() and genai.NewClient with no
// BaseURL.
//
// It lives in a module of its own because it is the one place that
// imports all three SDKs: each adapter's module requires only its own.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"google.golang.org/genai"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/anthropicretry"
	"github.com/llmretry/llmretry/contrib/genairetry"
	"github.com/llmretry/llmretry/contrib/openairetry"
	"github.com/llmretry/llmretry/llmretrytest"
)

func main() {
	openaiAPI, anthropicAPI, geminiAPI := llmretrytest.NewServer(), llmretrytest.NewServer(), llmretrytest.NewServer()
	defer openaiAPI.Close()
	defer anthropicAPI.Close()
	defer geminiAPI.Close()
	openaiAPI.Script("gpt-4o", llmretrytest.Status(503))               // down, for good
	anthropicAPI.Script("claude-sonnet-4-5", llmretrytest.Status(529)) // overloaded, for good
	geminiAPI.Script("gemini-2.5-flash", llmretrytest.Answer("Rayleigh scattering."))

	gem, err := geminiClient(context.Background(), geminiAPI.GeminiBaseURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	chain := newChain(
		openai.NewClient(option.WithBaseURL(openaiAPI.OpenAIBaseURL()), option.WithAPIKey("sk-example")),
		anthropic.NewClient(aoption.WithBaseURL(anthropicAPI.AnthropicBaseURL()), aoption.WithAPIKey("sk-ant-example")),
		gem,
	)
	chain.OnAttempt = func(_ context.Context, a llmretry.Attempt) { fmt.Println(a) }
	answer, err := chain.Do(context.Background(), "Why is the sky blue?")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(answer.Model+":", answer.Text)
}

// geminiClient builds a client for the Gemini API at baseURL, with the
// Transport that shows the adapter an error response's headers.
func geminiClient(ctx context.Context, baseURL string) (*genai.Client, error) {
	return genai.NewClient(ctx, &genai.ClientConfig{
		APIKey:      "gemini-example-key",
		Backend:     genai.BackendGeminiAPI,
		HTTPOptions: genai.HTTPOptions{BaseURL: baseURL},
		HTTPClient:  &http.Client{Transport: genairetry.Transport(nil)},
	})
}

// newChain builds the chain: gpt-4o and claude-sonnet-4-5, each retried
// once after a short wait, then gemini-2.5-flash.
func newChain(oai openai.Client, ant anthropic.Client, gem *genai.Client) *llmretry.Chain[string, llmretry.Completion] {
	once := llmretry.Policy{Waits: []time.Duration{10 * time.Millisecond}} // seconds in production
	gpt := openairetry.Chat(oai, "gpt-4o", func(q string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}}
	})
	gpt.Retry = once
	claude := anthropicretry.Messages(ant, "claude-sonnet-4-5", func(q string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{MaxTokens: 1024, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(q))}}
	})
	claude.Retry = once
	gemini := genairetry.GenerateContent(gem, "gemini-2.5-flash", func(q string) ([]*genai.Content, *genai.GenerateContentConfig) {
		return genai.Text(q), &genai.GenerateContentConfig{MaxOutputTokens: 1024}
	})
	return &llmretry.Chain[string, llmretry.Completion]{Backends: []llmretry.Backend[string, llmretry.Completion]{gpt, claude, gemini}}
}
