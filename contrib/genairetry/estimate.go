package genairetry

import (
	"encoding/json"

	"github.com/llmretry/llmretry"
	"google.golang.org/genai"
)

// A request's input tokens are estimated without a tokenizer
// (llmretry.EstimateInputTokens): the provider's next report corrects the
// figure anyway, and it only has to keep a burst of requests from
// overshooting a tokens-per-minute bucket before that report comes back.

// jsonBytes is the length of v as JSON, which is how tool declarations
// and function calls' arguments reach the model; 0 when it does not
// encode.
func jsonBytes(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// estimate is what a request of contents under config (nil: none) is
// estimated to use: its input from the text of its contents and system
// instruction (a content of its own) and the JSON of its tools; its
// output budget maxOutputTokens times candidateCount.
func estimate(contents []*genai.Content, config *genai.GenerateContentConfig) llmretry.Usage {
	n, messages := 0, 0
	for _, c := range contents {
		if c != nil {
			n += contentBytes(c)
			messages++
		}
	}
	var out int64
	if config != nil {
		if config.SystemInstruction != nil {
			n += contentBytes(config.SystemInstruction)
			messages++
		}
		if len(config.Tools) > 0 {
			n += jsonBytes(config.Tools)
		}
		// Thoughts count within maxOutputTokens, as they do in the
		// usage reported (OutputTokens holds them).
		out = int64(max(config.MaxOutputTokens, 0)) * int64(max(config.CandidateCount, 1))
	}
	return llmretry.Usage{InputTokens: llmretry.EstimateInputTokens(n, messages), OutputTokens: out}
}

// contentBytes is the length of the text of a content's parts: text
// (thoughts too), a function call's name and arguments and a function
// response's name and response as JSON, executable code and its result.
// Inline data and files are not counted: what an image, a video or a
// PDF costs depends on its size and length, which only decoding it
// would tell.
func contentBytes(c *genai.Content) int {
	n := 0
	for _, p := range c.Parts {
		if p == nil {
			continue
		}
		n += len(p.Text)
		if f := p.FunctionCall; f != nil {
			n += len(f.Name) + jsonBytes(f.Args)
		}
		if f := p.FunctionResponse; f != nil {
			n += len(f.Name) + jsonBytes(f.Response)
		}
		if e := p.ExecutableCode; e != nil {
			n += len(e.Code)
		}
		if r := p.CodeExecutionResult; r != nil {
			n += len(r.Output)
		}
	}
	return n
}
