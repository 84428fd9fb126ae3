package anthropicretry

import (
	"encoding/json"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/llmretry/llmretry"
)

// A request's input tokens are estimated without a tokenizer
// (llmretry.EstimateInputTokens): the provider's next report corrects the
// figure anyway, and it only has to keep a burst of requests from
// overshooting a tokens-per-minute bucket before that report comes back.

// jsonBytes is the length of v as JSON, which is how tool definitions
// and a tool call's input reach the model; 0 when it does not encode.
func jsonBytes(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// estimate is what a Messages request is estimated to use: its input
// from the system prompt (a message of its own), the text of its
// messages and the JSON of its tools; its output budget max_tokens,
// thinking included, as Anthropic counts it against the output limit
// when the request arrives.
func estimate(p *anthropic.MessageNewParams) llmretry.Usage {
	n, messages := 0, len(p.Messages)
	if len(p.System) > 0 {
		messages++
		for _, b := range p.System {
			n += len(b.Text)
		}
	}
	for _, m := range p.Messages {
		switch {
		case m.OfUser != nil:
			n += blocksBytes(m.OfUser.Content)
		case m.OfAssistant != nil:
			n += blocksBytes(m.OfAssistant.Content)
		case m.OfSystem != nil:
			for _, b := range m.OfSystem.Content {
				n += len(b.Text)
			}
		}
	}
	if len(p.Tools) > 0 {
		n += jsonBytes(p.Tools)
	}
	return llmretry.Usage{InputTokens: llmretry.EstimateInputTokens(n, messages), OutputTokens: max(p.MaxTokens, 0)}
}

// blocksBytes is the length of the text of a message's content blocks:
// text, thinking, a tool use's name and input as JSON, a tool result's
// text, a plain-text document. Images, PDFs and the server tools'
// blocks are not counted: what they cost depends on their size and
// pages, which only decoding them would tell.
func blocksBytes(blocks []anthropic.ContentBlockParamUnion) int {
	n := 0
	for _, b := range blocks {
		switch {
		case b.OfText != nil:
			n += len(b.OfText.Text)
		case b.OfThinking != nil:
			n += len(b.OfThinking.Thinking)
		case b.OfToolUse != nil:
			n += len(b.OfToolUse.Name) + jsonBytes(b.OfToolUse.Input)
		case b.OfToolResult != nil:
			for _, c := range b.OfToolResult.Content {
				if c.OfText != nil {
					n += len(c.OfText.Text)
				}
			}
		case b.OfDocument != nil && b.OfDocument.Source.OfText != nil:
			n += len(b.OfDocument.Source.OfText.Data)
		}
	}
	return n
}
