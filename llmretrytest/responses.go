package llmretrytest

import (
	"net/http"
	"strconv"
	"strings"
)

// responsesAPI speaks OpenAI's Responses API (POST /v1/responses) as
// openai-go reads it. Errors are the Chat Completions endpoint's: the same
// error bodies, codes and headers. An answer is a response object whose
// status says how it ended: "completed" for [Answer]; "incomplete" with
// incomplete_details.reason "max_output_tokens" for [Truncated] and
// "content_filter" for [Refuse]; "failed" with an error object for
// [Failed]; "in_progress" for [StreamUnfinished], whose answer never
// ended. A [ToolCall] answers with a function_call output item. A stream is SSE events, each named by its type and carrying it
// in its data: response.created, one response.output_text.delta per text
// chunk, and then the response as it ended, in response.completed,
// response.incomplete or response.failed; a [StreamError] sends an error
// event {"type":"error","code":errType,"message","param":null} after
// response.created. The Responses API sends no [DONE]. Usage is as for
// Chat Completions: input_tokens 10, one output token per text chunk,
// with input_tokens_details.cached_tokens and
// output_tokens_details.reasoning_tokens as [Step.WithUsageDetails] sets
// them; a stream tells it only in its last event, and the log records it
// once that is sent.
var responsesAPI = endpoint{
	name:      "openai-responses",
	requestID: "X-Request-Id",
	errorBody: openAIErrorBody,
	errorFor:  openAIError,
	json:      responsesJSON,
	stream:    responsesStream,
}

type responsesObject struct {
	ID                string                `json:"id"`
	Object            string                `json:"object"`
	CreatedAt         int64                 `json:"created_at"`
	Model             string                `json:"model"`
	Status            string                `json:"status"`
	Error             *responsesError       `json:"error"`              // null unless failed
	IncompleteDetails *responsesIncomplete  `json:"incomplete_details"` // null unless incomplete
	Output            []responsesOutputItem `json:"output"`
	Usage             *responsesUsage       `json:"usage"` // null while in progress
}

type responsesError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type responsesIncomplete struct {
	Reason string `json:"reason"`
}

// responsesOutputItem is a message (role and content) or a function_call
// (call_id, name and arguments).
type responsesOutputItem struct {
	Type      string             `json:"type"`
	ID        string             `json:"id"`
	Status    string             `json:"status"`
	Role      string             `json:"role,omitempty"`
	Content   []responsesContent `json:"content,omitempty"`
	CallID    string             `json:"call_id,omitempty"`
	Name      string             `json:"name,omitempty"`
	Arguments *string            `json:"arguments,omitempty"`
}

type responsesContent struct {
	Type        string   `json:"type"`
	Annotations []string `json:"annotations"` // always empty
	Text        string   `json:"text"`
}

type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

func newResponsesUsage(st Step, chunks int) *responsesUsage {
	u := &responsesUsage{InputTokens: inputTokens, OutputTokens: int64(chunks), TotalTokens: int64(inputTokens + chunks)}
	u.InputTokensDetails.CachedTokens = st.cached
	u.OutputTokensDetails.ReasoningTokens = st.reasoning
	return u
}

type responsesEvent struct {
	Type           string           `json:"type"`
	SequenceNumber int              `json:"sequence_number"`
	Response       *responsesObject `json:"response,omitempty"`
	// response.output_text.delta
	ItemID       *string   `json:"item_id,omitempty"`
	OutputIndex  *int      `json:"output_index,omitempty"`
	ContentIndex *int      `json:"content_index,omitempty"`
	Delta        *string   `json:"delta,omitempty"`
	Logprobs     *[]string `json:"logprobs,omitempty"`
	// response.output_item.added and .done
	Item *responsesOutputItem `json:"item,omitempty"`
	// response.function_call_arguments.done
	Arguments *string `json:"arguments,omitempty"`
	// error
	Code    *string `json:"code,omitempty"`
	Message *string `json:"message,omitempty"`
	Param   *string `json:"param,omitempty"`
}

// responsesID is the id of the response x answers with: the request's,
// or the background response's that x resumes.
func responsesID(x *exchange) string {
	if x.resumed != nil {
		return x.resumed.id
	}
	return "resp_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N)
}

func responsesItemID(x *exchange) string {
	return "msg_" + strings.TrimPrefix(responsesID(x), "resp_")
}

// responsesCall is a ToolCall's function_call item, with status and the
// arguments sent so far.
func responsesCall(x *exchange, st Step, status, args string) responsesOutputItem {
	return responsesOutputItem{
		Type: "function_call", ID: "fc_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N), Status: status,
		CallID: toolCallID(x), Name: st.tool, Arguments: &args,
	}
}

// responsesEnd is the status a step's response ends with, and the
// incomplete reason or error that goes with it.
func responsesEnd(st Step) (status string, incomplete *responsesIncomplete, failure *responsesError) {
	switch st.kind {
	case kindTruncated:
		return "incomplete", &responsesIncomplete{Reason: "max_output_tokens"}, nil
	case kindRefused:
		return "incomplete", &responsesIncomplete{Reason: "content_filter"}, nil
	case kindFailed:
		return "failed", nil, &responsesError{Code: st.errType, Message: "The model failed to generate a response: " + st.errType + "."}
	case kindStreamUnfinished:
		return "in_progress", nil, nil
	}
	return "completed", nil, nil
}

// responsesObj is the response object for st with text as its output.
func responsesObj(x *exchange, st Step, status string, chunks []string) *responsesObject {
	obj := &responsesObject{
		ID:        responsesID(x),
		Object:    "response",
		CreatedAt: x.req.Time.Unix(),
		Model:     x.req.Model,
		Status:    status,
		Output:    []responsesOutputItem{},
	}
	if text := strings.Join(chunks, ""); text != "" {
		itemStatus := "completed"
		if status != "completed" {
			itemStatus = "incomplete"
		}
		obj.Output = append(obj.Output, responsesOutputItem{
			Type: "message", ID: responsesItemID(x), Status: itemStatus, Role: "assistant",
			Content: []responsesContent{{Type: "output_text", Annotations: []string{}, Text: text}},
		})
	}
	if st.kind == kindToolCall {
		obj.Output = append(obj.Output, responsesCall(x, st, "completed", st.text))
	}
	if status != "in_progress" || st.kind == kindStreamUnfinished {
		// A JSON answer that never finished still reports what it
		// cost, as the Chat endpoint's does; a stream's opening
		// response reports nothing yet.
		obj.Usage = newResponsesUsage(st, len(chunks)+len(st.argChunks()))
	}
	return obj
}

func responsesJSON(x *exchange, st Step) []byte {
	status, incomplete, failure := responsesEnd(st)
	obj := responsesObj(x, st, status, st.textChunks())
	obj.IncompleteDetails, obj.Error = incomplete, failure
	return mustJSON(obj)
}

func responsesStream(x *exchange, st Step) bool {
	seq := 0
	send := func(ev responsesEvent) bool {
		ev.SequenceNumber = seq
		seq++
		return x.event(ev.Type, mustJSON(ev))
	}
	x.startStream(&st)
	if st.kind == kindMalformed {
		return x.event("response.created", []byte(`{"type":"response.created","sequence_number":0,"response":{"id":"`+responsesID(x)+`","obj`))
	}
	if !send(responsesEvent{Type: "response.created", Response: responsesObj(x, Step{}, "in_progress", nil)}) {
		return false
	}
	if st.kind == kindStreamError {
		errType, _, param, msg := openAIError(http.StatusOK, st, x.req.Model)
		return send(responsesEvent{Type: "error", Code: &errType, Message: &msg, Param: nullable(param)})
	}
	id, zero := responsesItemID(x), 0
	if st.kind == kindToolCall {
		// The item opens with no arguments; they come a piece per event,
		// and then whole, before the item is done.
		call := responsesCall(x, st, "in_progress", "")
		if !send(responsesEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &call}) {
			return false
		}
		for i, args := range st.argChunks() {
			if !x.pause(st, i) || !send(responsesEvent{Type: "response.function_call_arguments.delta",
				ItemID: &call.ID, OutputIndex: &zero, Delta: &args}) {
				return false
			}
		}
		done := responsesCall(x, st, "completed", st.text)
		if !send(responsesEvent{Type: "response.function_call_arguments.done", ItemID: &call.ID, OutputIndex: &zero, Arguments: &st.text}) ||
			!send(responsesEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &done}) {
			return false
		}
	}
	texts := st.textChunks()
	garble := func() bool {
		return x.event("response.output_text.delta", []byte(`{"type":"response.output_text.delta","sequence_number":`+strconv.Itoa(seq)+`,"item_id":"`+id+`","delta":"wor`))
	}
	fail := func() bool {
		errType, _, param, msg := openAIError(http.StatusOK, StreamError(st.faultType), x.req.Model)
		return send(responsesEvent{Type: "error", Code: &errType, Message: &msg, Param: nullable(param)})
	}
	for i, text := range texts {
		if st.breaksAt(i, len(texts)) {
			return x.broken(st, garble, fail)
		}
		if !x.pause(st, i) || !send(responsesEvent{Type: "response.output_text.delta",
			ItemID: &id, OutputIndex: &zero, ContentIndex: &zero, Delta: &text, Logprobs: &[]string{}}) {
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
	status, incomplete, failure := responsesEnd(st)
	obj := responsesObj(x, st, status, texts)
	obj.IncompleteDetails, obj.Error = incomplete, failure
	name := "response.completed"
	switch status {
	case "incomplete":
		name = "response.incomplete"
	case "failed":
		name = "response.failed"
	}
	return x.sendingUsage(answerUsage(st), func() bool { return send(responsesEvent{Type: name, Response: obj}) })
}
