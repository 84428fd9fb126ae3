package llmretrytest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode"
)

// This file holds continuation as the server speaks it: a request that
// asks the model to go on from text it was given (an Anthropic assistant
// prefill, an OpenAI-compatible assistant message with a prefix flag),
// and a Responses API background response whose stream is resumed after
// a sequence number.

// message is one message of a Chat Completions or Anthropic request.
type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string, or an array of blocks
	Prefix  bool            `json:"prefix"`  // DeepSeek's and Mistral's: continue this message
}

// text is the message's text: its content string, or its text blocks
// joined.
func (m message) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Type == "text" {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// continuation is the text a request asks ep's model to continue, "" for
// none, and why the request is refused, if it is. Anthropic continues a
// conversation that ends with an assistant message (a prefill), and
// refuses one whose text ends with white space, as Anthropic does; Chat
// Completions continues a last assistant message sent with "prefix":
// true, or with continue_final_message; the Responses API and Gemini
// continue nothing that way.
func continuation(ep *endpoint, in *incoming) (text, problem string) {
	n := len(in.Messages)
	if n == 0 || in.Messages[n-1].Role != "assistant" {
		return "", ""
	}
	last := in.Messages[n-1]
	switch ep {
	case &anthropic:
		text = last.text()
		if text != strings.TrimRightFunc(text, unicode.IsSpace) {
			return "", "messages: final assistant content cannot end with trailing whitespace"
		}
		return text, ""
	case &openAI:
		if last.Prefix || in.ContinueFinalMessage {
			return last.text(), ""
		}
	}
	return "", ""
}

// continuing is s as it plays for a request that asks to continue
// prefix: an answer's rest, after prefix; false when the answer does not
// begin with it. A step with no answer's text plays as it is.
func (s Step) continuing(prefix string) (Step, bool) {
	switch s.kind {
	case kindAnswer, kindTruncated, kindRefused:
		rest, ok := strings.CutPrefix(s.text, prefix)
		s.text = rest
		return s, ok
	}
	return s, true
}

// backgroundResponse is a Responses API response run in the background:
// the answer as the model made it, whatever became of the stream that
// carried it, for a resumption to stream on from.
type backgroundResponse struct {
	id    string
	model string
	step  Step     // the answer whole: the step played, without its fault
	texts []string // its text chunks; chunk i went in the event of sequence number i+1
}

// keepBackground keeps the response x streams for st, when it runs in the
// background and has an answer to resume: the model goes on with it
// server-side, whatever happens to the stream. An answer that fails
// inside (FailAfter) has nothing more to resume.
func (s *Server) keepBackground(x *exchange, st Step) {
	if !x.background {
		return
	}
	switch {
	case st.kind != kindAnswer && st.kind != kindTruncated && st.kind != kindRefused, st.fault == faultError:
		return
	}
	whole := st.plain()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.background == nil {
		s.background = make(map[string]*backgroundResponse)
	}
	s.background[responsesID(x)] = &backgroundResponse{id: responsesID(x), model: x.req.Model, step: whole, texts: whole.textChunks()}
}

// resume serves GET /v1/responses/{id}: the stream of a background
// response, after the sequence number starting_after. It is logged as a
// streaming request to the response's model, and plays that model's next
// step: an answer's step streams the rest of the response, broken as its
// own DropAfter (or StallAfter, GarbleAfter, FailAfter) says, counting the
// chunks this stream sends; any other step plays as it would for a new
// request. An id the server does not keep gets a 404, logged with Model
// "".
func (s *Server) resume(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	bg := s.background[id]
	s.mu.Unlock()
	after, _ := strconv.Atoi(r.URL.Query().Get("starting_after"))
	x := &exchange{s: s, w: w, ctx: r.Context(), requestID: responsesAPI.requestID, resumed: bg}
	defer func() { s.traceEvent("end", x.req) }()
	in := incoming{Stream: true}
	status := 0
	if bg == nil {
		status = http.StatusNotFound
	} else {
		in.Model = bg.model
		x.continues = strings.Join(bg.texts[:min(max(after, 0), len(bg.texts))], "")
	}
	st, ok := s.arrive(x, &responsesAPI, in, status, r.Header.Clone())
	switch {
	case status != 0:
		writeError(w, &responsesAPI, nil, status, "invalid_request_error", "", "", "Response with id '"+id+"' not found.", x.id)
	case !ok:
		errType, code, param, msg := openAIError(http.StatusNotFound, Step{}, in.Model)
		writeError(w, &responsesAPI, nil, http.StatusNotFound, errType, code, param, msg, x.id)
	case st.kind == kindAnswer || st.kind == kindTruncated || st.kind == kindRefused:
		if !x.wait(st.after) || !resumeStream(x, bg, st, after) {
			panic(http.ErrAbortHandler)
		}
	default:
		s.play(x, &responsesAPI, st)
	}
}

// resumeStream streams background response bg after sequence number
// after, broken as st says.
func resumeStream(x *exchange, bg *backgroundResponse, st Step, after int) bool {
	seq := after + 1
	send := func(ev responsesEvent) bool {
		ev.SequenceNumber = seq
		seq++
		return x.event(ev.Type, mustJSON(ev))
	}
	x.startStream(&st)
	id, zero := responsesItemID(x), 0
	rest := bg.texts[min(max(after, 0), len(bg.texts)):]
	garble := func() bool {
		return x.event("response.output_text.delta", []byte(`{"type":"response.output_text.delta","sequence_number":`+strconv.Itoa(seq)+`,"item_id":"`+id+`","delta":"wor`))
	}
	fail := func() bool {
		errType, _, param, msg := openAIError(http.StatusOK, StreamError(st.faultType), bg.model)
		return send(responsesEvent{Type: "error", Code: &errType, Message: &msg, Param: nullable(param)})
	}
	for i, text := range rest {
		if st.breaksAt(i, len(rest)) {
			return x.broken(st, garble, fail)
		}
		if !x.pause(st, i) || !send(responsesEvent{Type: "response.output_text.delta",
			ItemID: &id, OutputIndex: &zero, ContentIndex: &zero, Delta: &text, Logprobs: &[]string{}}) {
			return false
		}
	}
	if st.breaksAt(len(rest), len(rest)) {
		return x.broken(st, garble, fail)
	}
	status, incomplete, failure := responsesEnd(bg.step)
	obj := responsesObj(x, bg.step, status, bg.texts)
	obj.IncompleteDetails, obj.Error = incomplete, failure
	name := "response.completed"
	if status == "incomplete" {
		name = "response.incomplete"
	}
	return x.sendingUsage(answerUsage(bg.step), func() bool { return send(responsesEvent{Type: name, Response: obj}) })
}
