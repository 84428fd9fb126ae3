package llmretrytest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// anthropic speaks Messages as anthropic-sdk-go reads it: an error body
// {"type":"error","error":{...}} becomes the SDK's API error; a stream is
// named SSE events from message_start to message_stop, and an "error"
// event ends the stream with an API error. Every answer reports its usage
// as Anthropic does, input_tokens 10 (the server does not tokenize) and
// one output token per text chunk: a JSON answer in its usage block; a
// stream in message_start (input_tokens 10, output_tokens 1) and, at its
// end, in message_delta (the final output_tokens), so a client that sees
// a stream cut after message_start knows what it was billed so far.
var anthropic = endpoint{
	name:      "anthropic",
	requestID: "Request-Id",
	errorBody: anthropicErrorBody,
	errorFor:  anthropicError,
	json:      anthropicJSON,
	stream:    anthropicStream,
}

type anthropicErrorJSON struct {
	Type  string               `json:"type"` // "error"
	Error anthropicErrorObject `json:"error"`
}

type anthropicErrorObject struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func anthropicErrorBody(status int, errType, code, param, message string) []byte {
	return mustJSON(anthropicErrorJSON{Type: "error", Error: anthropicErrorObject{Type: errType, Message: message}})
}

// anthropicError gives the type and message of an Anthropic error
// response with status, or of st's own error; Anthropic's errors have no
// code or param.
func anthropicError(status int, st Step, model string) (errType, code, param, message string) {
	switch st.kind {
	case kindContextLength:
		return "invalid_request_error", "", "", "prompt is too long: 210000 tokens > 200000 maximum"
	case kindStreamError:
		return st.errType, "", "", anthropicMessage(st.errType, model)
	}
	switch status {
	case http.StatusUnauthorized:
		errType = "authentication_error"
	case http.StatusForbidden:
		errType = "permission_error"
	case http.StatusNotFound:
		errType = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		errType = "request_too_large"
	case http.StatusTooManyRequests:
		errType = "rate_limit_error"
	case 529:
		errType = "overloaded_error"
	default:
		errType = "invalid_request_error"
		if status >= 500 {
			errType = "api_error"
		}
	}
	return errType, "", "", anthropicMessage(errType, model)
}

func anthropicMessage(errType, model string) string {
	switch errType {
	case "authentication_error":
		return "invalid x-api-key"
	case "permission_error":
		return "Your API key does not have permission to use the specified resource."
	case "not_found_error":
		return "model: " + model
	case "request_too_large":
		return "Request exceeds the maximum allowed number of bytes."
	case "rate_limit_error":
		return "This request would exceed your organization's rate limit. Please try again later."
	case "overloaded_error":
		return "Overloaded"
	case "api_error":
		return "Internal server error"
	case "invalid_request_error":
		return "Invalid request."
	}
	return "Error: " + errType
}

type anthropicMessageJSON struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"` // "message"
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"` // always null
	Usage        anthropicUsage   `json:"usage"`
}

// anthropicBlock is a text block (text) or a tool_use block (id, name,
// input).
type anthropicBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// anthropicToolUse is a ToolCall's tool_use block, with input as given.
func anthropicToolUse(x *exchange, st Step, input string) anthropicBlock {
	return anthropicBlock{Type: "tool_use", ID: "toolu_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N), Name: st.tool, Input: json.RawMessage(input)}
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens,omitempty"`
	OutputTokens int `json:"output_tokens"`
}

func anthropicID(x *exchange) string {
	return "msg_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N)
}

// anthropicStop is the stop_reason a step ends with; nil (null) for a
// stream that never finishes.
func anthropicStop(st Step) *string {
	switch st.kind {
	case kindTruncated:
		return nullable("max_tokens")
	case kindRefused:
		return nullable("refusal")
	case kindToolCall:
		return nullable("tool_use")
	case kindStreamUnfinished:
		return nil
	}
	return nullable("end_turn")
}

func anthropicJSON(x *exchange, st Step) []byte {
	chunks := st.textChunks()
	content := []anthropicBlock{} // Anthropic sends [] for an answer with no text
	if len(chunks) > 0 {
		text := strings.Join(chunks, "")
		content = append(content, anthropicBlock{Type: "text", Text: &text})
	}
	if st.kind == kindToolCall {
		content = append(content, anthropicToolUse(x, st, st.text))
	}
	return mustJSON(anthropicMessageJSON{
		ID:         anthropicID(x),
		Type:       "message",
		Role:       "assistant",
		Model:      x.req.Model,
		Content:    content,
		StopReason: anthropicStop(st),
		Usage:      anthropicUsage{InputTokens: inputTokens, OutputTokens: st.outputTokens()},
	})
}

type anthropicStart struct {
	Type    string               `json:"type"` // "message_start"
	Message anthropicMessageJSON `json:"message"`
}

type anthropicBlockStart struct {
	Type         string         `json:"type"` // "content_block_start"
	Index        int            `json:"index"`
	ContentBlock anthropicBlock `json:"content_block"`
}

type anthropicBlockDelta struct {
	Type  string         `json:"type"` // "content_block_delta"
	Index int            `json:"index"`
	Delta anthropicDelta `json:"delta"`
}

// anthropicDelta is a text_delta (text) or an input_json_delta
// (partial_json); neither is ever empty.
type anthropicDelta struct {
	Type        string `json:"type"`
	Text        string `json:"text,omitempty"`
	PartialJSON string `json:"partial_json,omitempty"`
}

type anthropicMessageDelta struct {
	Type  string `json:"type"` // "message_delta"
	Delta struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"` // always null
	} `json:"delta"`
	Usage anthropicUsage `json:"usage"`
}

func anthropicStream(x *exchange, st Step) bool {
	x.startStream(&st)
	if st.kind == kindMalformed {
		return x.event("message_start", []byte(`{"type":"message_start","message":{"id":"`+anthropicID(x)+`","type":"mess`))
	}
	start := anthropicStart{Type: "message_start", Message: anthropicMessageJSON{
		ID:      anthropicID(x),
		Type:    "message",
		Role:    "assistant",
		Model:   x.req.Model,
		Content: []anthropicBlock{},
		Usage:   anthropicUsage{InputTokens: inputTokens, OutputTokens: 1},
	}}
	if !x.sendingUsage(Usage{InputTokens: inputTokens, OutputTokens: 1}, func() bool { return x.event("message_start", mustJSON(start)) }) {
		return false
	}
	if st.kind == kindStreamError {
		errType, _, _, msg := anthropicError(http.StatusOK, st, x.req.Model)
		return x.event("error", anthropicErrorBody(http.StatusOK, errType, "", "", msg))
	}
	// Anthropic sends pings at any point; clients must skip them.
	if !x.event("ping", []byte(`{"type": "ping"}`)) {
		return false
	}
	if st.kind == kindToolCall {
		// The block opens with an empty input; the input comes a piece
		// of JSON per delta.
		block := anthropicBlockStart{Type: "content_block_start", ContentBlock: anthropicToolUse(x, st, "{}")}
		if !x.event("content_block_start", mustJSON(block)) {
			return false
		}
		for i, args := range st.argChunks() {
			delta := anthropicBlockDelta{Type: "content_block_delta", Delta: anthropicDelta{Type: "input_json_delta", PartialJSON: args}}
			if !x.pause(st, i) || !x.event("content_block_delta", mustJSON(delta)) {
				return false
			}
		}
		if !x.event("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`)) {
			return false
		}
	}
	texts := st.textChunks()
	if len(texts) > 0 {
		empty := ""
		block := anthropicBlockStart{Type: "content_block_start", ContentBlock: anthropicBlock{Type: "text", Text: &empty}}
		if !x.event("content_block_start", mustJSON(block)) {
			return false
		}
	}
	garble := func() bool {
		return x.event("content_block_delta", []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"wor`))
	}
	fail := func() bool {
		errType, _, _, msg := anthropicError(http.StatusOK, StreamError(st.faultType), x.req.Model)
		return x.event("error", anthropicErrorBody(http.StatusOK, errType, "", "", msg))
	}
	for i, text := range texts {
		if st.breaksAt(i, len(texts)) {
			return x.broken(st, garble, fail)
		}
		delta := anthropicBlockDelta{Type: "content_block_delta", Delta: anthropicDelta{Type: "text_delta", Text: text}}
		if !x.pause(st, i) || !x.event("content_block_delta", mustJSON(delta)) {
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
	if len(texts) > 0 && !x.event("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`)) {
		return false
	}
	end := anthropicMessageDelta{Type: "message_delta", Usage: anthropicUsage{OutputTokens: st.outputTokens()}}
	end.Delta.StopReason = anthropicStop(st)
	// message_delta's output_tokens is the total.
	if !x.sendingUsage(answerUsage(st), func() bool { return x.event("message_delta", mustJSON(end)) }) {
		return false
	}
	return x.event("message_stop", []byte(`{"type":"message_stop"}`))
}
