package llmretrytest

import (
	"net/http"
	"strconv"
	"strings"
)

// openAI speaks Chat Completions as openai-go reads it: an error body's
// "error" object becomes the SDK's API error; a stream is "data:" lines
// that end with "data: [DONE]", and any data with an "error" key ends the
// stream with an error.
var openAI = endpoint{
	name:      "openai",
	requestID: "X-Request-Id",
	errorBody: openAIErrorBody,
	errorFor:  openAIError,
	json:      openAIJSON,
	stream:    openAIStream,
}

type openAIErrorJSON struct {
	Error openAIErrorObject `json:"error"`
}

type openAIErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"` // null when the error names no parameter
	Code    *string `json:"code"`  // null when the error has no code
}

func openAIErrorObj(errType, code, param, message string) openAIErrorObject {
	return openAIErrorObject{Message: message, Type: errType, Param: nullable(param), Code: nullable(code)}
}

func openAIErrorBody(status int, errType, code, param, message string) []byte {
	return mustJSON(openAIErrorJSON{openAIErrorObj(errType, code, param, message)})
}

// openAIError gives the type, code, param and message of an OpenAI error
// response with status, or of st's own error. Clients branch on the type
// and code; the messages only need to read like OpenAI's.
func openAIError(status int, st Step, model string) (errType, code, param, message string) {
	switch st.kind {
	case kindInsufficientQuota:
		return "insufficient_quota", "insufficient_quota", "", "You exceeded your current quota, please check your plan and billing details."
	case kindContentFilter:
		return "invalid_request_error", "content_filter", "prompt",
			"The response was filtered due to the prompt triggering the content management policy. Please modify your prompt and retry."
	case kindContextLength:
		return "invalid_request_error", "context_length_exceeded", "messages",
			"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages."
	case kindStreamError:
		return st.errType, "", "", "The server had an error while processing your request: " + st.errType + "."
	case kindStatus:
		if st.errType != "" { // refused by the model's limits
			return st.errType, "rate_limit_exceeded", "", "Rate limit reached for " + st.errType + "."
		}
	}
	switch {
	case status == http.StatusUnauthorized:
		return "invalid_request_error", "invalid_api_key", "", "Incorrect API key provided."
	case status == http.StatusNotFound:
		return "invalid_request_error", "model_not_found", "", "The model `" + model + "` does not exist or you do not have access to it."
	case status == http.StatusTooManyRequests:
		return "requests", "rate_limit_exceeded", "", "Rate limit reached for requests."
	case status == http.StatusServiceUnavailable:
		return "server_error", "", "", "The server is overloaded or not ready yet."
	case status >= 500:
		return "server_error", "", "", "The server had an error while processing your request. Sorry about that!"
	}
	return "invalid_request_error", "", "", "Invalid request (" + strconv.Itoa(status) + ")."
}

type openAIUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// The details are sent only when a step sets them (WithUsageDetails).
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details,omitempty"`
}

func newOpenAIUsage(st Step, chunks int) *openAIUsage {
	u := &openAIUsage{PromptTokens: inputTokens, CompletionTokens: chunks, TotalTokens: inputTokens + chunks}
	if st.cached != 0 || st.reasoning != 0 {
		u.PromptTokensDetails = &struct {
			CachedTokens int64 `json:"cached_tokens"`
		}{st.cached}
		u.CompletionTokensDetails = &struct {
			ReasoningTokens int64 `json:"reasoning_tokens"`
		}{st.reasoning}
	}
	return u
}

type openAICompletion struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Created int64          `json:"created"`
	Model   string         `json:"model"`
	Choices []openAIChoice `json:"choices"`
	Usage   *openAIUsage   `json:"usage,omitempty"`
}

type openAIChoice struct {
	Index        int           `json:"index"`
	Message      openAIMessage `json:"message"`
	Logprobs     *struct{}     `json:"logprobs"` // always null
	FinishReason *string       `json:"finish_reason"`
}

type openAIMessage struct {
	Role      string           `json:"role"`
	Content   *string          `json:"content"` // null for a tool call
	Refusal   *string          `json:"refusal"` // always null
	ToolCalls []openAIToolCall `json:"tool_calls,omitempty"`
}

// openAIToolCall is a tool call in a message, and in a stream's delta,
// where the id, type and name come in its first chunk only.
type openAIToolCall struct {
	Index    *int               `json:"index,omitempty"` // in a delta only
	ID       string             `json:"id,omitempty"`
	Type     string             `json:"type,omitempty"`
	Function openAIFunctionCall `json:"function"`
}

type openAIFunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type openAIChunk struct {
	ID      string              `json:"id"`
	Object  string              `json:"object"`
	Created int64               `json:"created"`
	Model   string              `json:"model"`
	Choices []openAIChunkChoice `json:"choices"`
	Usage   *openAIUsage        `json:"usage,omitempty"`
}

type openAIChunkChoice struct {
	Index        int         `json:"index"`
	Delta        openAIDelta `json:"delta"`
	Logprobs     *struct{}   `json:"logprobs"` // always null
	FinishReason *string     `json:"finish_reason"`
}

type openAIDelta struct {
	Role      string           `json:"role,omitempty"`
	Content   *string          `json:"content,omitempty"`
	ToolCalls []openAIToolCall `json:"tool_calls,omitempty"`
}

func openAIID(x *exchange) string {
	return "chatcmpl-" + idSafe(x.req.Model) + "-" + strconv.Itoa(x.req.N)
}

// toolCallID is the id of a ToolCall's call, on the OpenAI endpoints.
func toolCallID(x *exchange) string {
	return "call_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N)
}

// openAIFinish is the finish_reason a step ends with; nil (null) for a
// stream that never finishes.
func openAIFinish(st Step) *string {
	switch st.kind {
	case kindTruncated:
		return nullable("length")
	case kindRefused:
		return nullable("content_filter")
	case kindToolCall:
		return nullable("tool_calls")
	case kindStreamUnfinished:
		return nil
	}
	return nullable("stop")
}

func openAIJSON(x *exchange, st Step) []byte {
	msg := openAIMessage{Role: "assistant"}
	if st.kind == kindToolCall {
		msg.ToolCalls = []openAIToolCall{{ID: toolCallID(x), Type: "function", Function: openAIFunctionCall{Name: st.tool, Arguments: st.text}}}
	} else {
		text := strings.Join(st.textChunks(), "")
		msg.Content = &text
	}
	return mustJSON(openAICompletion{
		ID:      openAIID(x),
		Object:  "chat.completion",
		Created: x.req.Time.Unix(),
		Model:   x.req.Model,
		Choices: []openAIChoice{{
			Message:      msg,
			FinishReason: openAIFinish(st),
		}},
		Usage: newOpenAIUsage(st, st.outputTokens()),
	})
}

func openAIStream(x *exchange, st Step) bool {
	chunk := func(delta openAIDelta, finish *string) []byte {
		return mustJSON(openAIChunk{
			ID:      openAIID(x),
			Object:  "chat.completion.chunk",
			Created: x.req.Time.Unix(),
			Model:   x.req.Model,
			Choices: []openAIChunkChoice{{Delta: delta, FinishReason: finish}},
		})
	}
	x.startStream(&st)
	if st.kind == kindMalformed {
		return x.event("", []byte(`{"id":"`+openAIID(x)+`","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel`))
	}
	// OpenAI opens every stream with a chunk that carries the role and no
	// text; a client must not take it for the start of the answer.
	empty := ""
	if !x.event("", chunk(openAIDelta{Role: "assistant", Content: &empty}, nil)) {
		return false
	}
	if st.kind == kindStreamError {
		errType, code, param, msg := openAIError(http.StatusOK, st, x.req.Model)
		return x.event("", mustJSON(openAIErrorJSON{openAIErrorObj(errType, code, param, msg)}))
	}
	if st.kind == kindToolCall {
		// The call's id, type and name come first, with no arguments;
		// then the arguments, a piece per chunk.
		zero := 0
		call := openAIToolCall{Index: &zero, ID: toolCallID(x), Type: "function", Function: openAIFunctionCall{Name: st.tool}}
		if !x.event("", chunk(openAIDelta{ToolCalls: []openAIToolCall{call}}, nil)) {
			return false
		}
		for i, args := range st.argChunks() {
			piece := openAIToolCall{Index: &zero, Function: openAIFunctionCall{Arguments: args}}
			if !x.pause(st, i) || !x.event("", chunk(openAIDelta{ToolCalls: []openAIToolCall{piece}}, nil)) {
				return false
			}
		}
	}
	texts := st.textChunks()
	garble := func() bool {
		return x.event("", []byte(`{"id":"`+openAIID(x)+`","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"wor`))
	}
	fail := func() bool {
		errType, code, param, msg := openAIError(http.StatusOK, StreamError(st.faultType), x.req.Model)
		return x.event("", mustJSON(openAIErrorJSON{openAIErrorObj(errType, code, param, msg)}))
	}
	for i, text := range texts {
		if st.breaksAt(i, len(texts)) {
			return x.broken(st, garble, fail)
		}
		if !x.pause(st, i) || !x.event("", chunk(openAIDelta{Content: &text}, nil)) {
			return false
		}
	}
	if st.breaksAt(len(texts), len(texts)) {
		return x.broken(st, garble, fail)
	}
	switch st.kind {
	case kindStreamDrop:
		return false
	case kindStreamUnfinished:
		return true
	case kindStreamStall:
		x.stall()
		return false
	}
	if !x.event("", chunk(openAIDelta{}, openAIFinish(st))) {
		return false
	}
	if x.includeUsage {
		// With stream_options.include_usage, OpenAI sends the counts in a
		// last chunk that has no choices.
		usage := mustJSON(openAIChunk{
			ID:      openAIID(x),
			Object:  "chat.completion.chunk",
			Created: x.req.Time.Unix(),
			Model:   x.req.Model,
			Choices: []openAIChunkChoice{},
			Usage:   newOpenAIUsage(st, st.outputTokens()),
		})
		if !x.sendingUsage(answerUsage(st), func() bool { return x.event("", usage) }) {
			return false
		}
	}
	return x.event("", []byte("[DONE]"))
}

// nullable is s as a JSON string, or null when s is empty.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
