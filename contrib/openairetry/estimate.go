package openairetry

import (
	"encoding/json"

	"github.com/llmretry/llmretry"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// A request's input tokens are estimated without a tokenizer
// (llmretry.EstimateInputTokens): the provider's next report corrects the
// figure anyway, and it only has to keep a burst of requests from
// overshooting a tokens-per-minute bucket before that report comes back.

// jsonBytes is the length of v as JSON, which is how tool definitions
// reach the model; 0 when it does not encode.
func jsonBytes(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// chatEstimate is what a Chat Completions request is estimated to use:
// its input from the text of its messages and the JSON of its tools, its
// output budget max_completion_tokens (else max_tokens) times n.
func chatEstimate(p *openai.ChatCompletionNewParams) llmretry.Usage {
	n := 0
	for i := range p.Messages {
		n += chatMessageBytes(&p.Messages[i])
	}
	if len(p.Tools) > 0 {
		n += jsonBytes(p.Tools)
	}
	var out int64
	switch {
	case p.MaxCompletionTokens.Valid():
		out = p.MaxCompletionTokens.Value
	case p.MaxTokens.Valid():
		out = p.MaxTokens.Value
	}
	if p.N.Valid() && p.N.Value > 1 {
		// Each choice has the whole budget, and the provider counts
		// them all against the limit.
		out *= p.N.Value
	}
	return llmretry.Usage{InputTokens: llmretry.EstimateInputTokens(n, len(p.Messages)), OutputTokens: out}
}

// chatMessageBytes is the length of a message's text: its content's
// string or text parts, an assistant's refusal and tool calls. Images,
// audio and files are not counted: what they cost depends on their
// size, which only decoding them would tell.
func chatMessageBytes(m *openai.ChatCompletionMessageParamUnion) int {
	n := 0
	switch c := m.GetContent().AsAny().(type) {
	case *string:
		n += len(*c)
	case *[]openai.ChatCompletionContentPartTextParam:
		for _, p := range *c {
			n += len(p.Text)
		}
	case *[]openai.ChatCompletionContentPartUnionParam:
		for _, p := range *c {
			if p.OfText != nil {
				n += len(p.OfText.Text)
			}
		}
	case *[]openai.ChatCompletionAssistantMessageParamContentArrayOfContentPartUnion:
		for _, p := range *c {
			switch {
			case p.OfText != nil:
				n += len(p.OfText.Text)
			case p.OfRefusal != nil:
				n += len(p.OfRefusal.Refusal)
			}
		}
	}
	if a := m.OfAssistant; a != nil {
		if a.Refusal.Valid() {
			n += len(a.Refusal.Value)
		}
		for _, tc := range a.ToolCalls {
			switch {
			case tc.OfFunction != nil:
				n += len(tc.OfFunction.Function.Name) + len(tc.OfFunction.Function.Arguments)
			case tc.OfCustom != nil:
				n += len(tc.OfCustom.Custom.Name) + len(tc.OfCustom.Custom.Input)
			}
		}
	}
	return n
}

// responsesEstimate is what a Responses API request is estimated to
// use: its input from its instructions, the text of its input and the
// JSON of its tools, each instruction, input string and input item
// counted as a message; its output budget max_output_tokens.
func responsesEstimate(p *responses.ResponseNewParams) llmretry.Usage {
	n, messages := 0, 0
	if p.Instructions.Valid() {
		n += len(p.Instructions.Value)
		messages++
	}
	if p.Input.OfString.Valid() {
		n += len(p.Input.OfString.Value)
		messages++
	}
	for i := range p.Input.OfInputItemList {
		n += itemBytes(&p.Input.OfInputItemList[i])
		messages++
	}
	if len(p.Tools) > 0 {
		n += jsonBytes(p.Tools)
	}
	var out int64
	if p.MaxOutputTokens.Valid() {
		out = p.MaxOutputTokens.Value
	}
	return llmretry.Usage{InputTokens: llmretry.EstimateInputTokens(n, messages), OutputTokens: out}
}

// itemBytes is the length of an input item's text: a message's text and
// refusal parts, a function or custom tool call's name and arguments and
// its output's text, a reasoning item's summary. Other items (built-in
// tools' calls, images, files) count only as a message.
func itemBytes(it *responses.ResponseInputItemUnionParam) int {
	n := 0
	switch {
	case it.OfMessage != nil:
		n += len(it.OfMessage.Content.OfString.Value)
		n += inputContentBytes(it.OfMessage.Content.OfInputItemContentList)
	case it.OfInputMessage != nil:
		n += inputContentBytes(it.OfInputMessage.Content)
	case it.OfOutputMessage != nil:
		for _, p := range it.OfOutputMessage.Content {
			switch {
			case p.OfOutputText != nil:
				n += len(p.OfOutputText.Text)
			case p.OfRefusal != nil:
				n += len(p.OfRefusal.Refusal)
			}
		}
	case it.OfFunctionCall != nil:
		n += len(it.OfFunctionCall.Name) + len(it.OfFunctionCall.Arguments)
	case it.OfFunctionCallOutput != nil:
		o := &it.OfFunctionCallOutput.Output
		n += len(o.OfString.Value)
		for _, p := range o.OfResponseFunctionCallOutputItemArray {
			if p.OfInputText != nil {
				n += len(p.OfInputText.Text)
			}
		}
	case it.OfCustomToolCall != nil:
		n += len(it.OfCustomToolCall.Name) + len(it.OfCustomToolCall.Input)
	case it.OfCustomToolCallOutput != nil:
		o := &it.OfCustomToolCallOutput.Output
		n += len(o.OfString.Value)
		for _, p := range o.OfOutputContentList {
			if p.OfInputText != nil {
				n += len(p.OfInputText.Text)
			}
		}
	case it.OfReasoning != nil:
		for _, s := range it.OfReasoning.Summary {
			n += len(s.Text)
		}
	}
	return n
}

// inputContentBytes is the length of the text parts of a message's
// content list.
func inputContentBytes(parts responses.ResponseInputMessageContentListParam) int {
	n := 0
	for _, p := range parts {
		if p.OfInputText != nil {
			n += len(p.OfInputText.Text)
		}
	}
	return n
}
