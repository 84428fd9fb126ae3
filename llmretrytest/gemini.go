package llmretrytest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// gemini speaks the Gemini API's generateContent as google.golang.org/genai
// reads it. The model is named by the path, not the body:
// POST /v1beta/models/{model}:generateContent answers JSON, and
// :streamGenerateContent?alt=sse a stream of "data:" events, each a whole
// GenerateContentResponse, the last one carrying the finishReason; there
// is no end sentinel. An error is Google's JSON error,
// {"error":{"code","message","status","details"}}, as a response body or
// as one data event inside a stream.
var gemini = endpoint{
	name: "gemini",
	// Google sends no request id of its own; the server sends one all the
	// same, so a test can match a response with the log.
	requestID: "X-Request-Id",
	errorBody: geminiErrorBody,
	errorFor:  geminiError,
	json:      geminiJSON,
	stream:    geminiStream,
}

// GeminiBaseURL returns the base URL to give google.golang.org/genai's
// ClientConfig.HTTPOptions.BaseURL, with the Gemini API backend: URL +
// "/". The client adds the API version, v1beta.
func (s *Server) GeminiBaseURL() string { return s.URL + "/" }

// geminiPath reads the model and the method from the path of a Gemini
// request; ok is false for any other path.
func geminiPath(path string) (model string, stream, ok bool) {
	rest, ok := strings.CutPrefix(path, "/v1beta/models/")
	if !ok {
		return "", false, false
	}
	model, method, ok := strings.Cut(rest, ":")
	switch {
	case !ok || model == "":
		return "", false, false
	case method == "generateContent":
		return model, false, true
	case method == "streamGenerateContent":
		return model, true, true
	}
	return "", false, false
}

// The quota a Gemini 429 names in its QuotaFailure, and how the error's
// code says which one to name: geminiError chooses, geminiErrorBody
// writes.
const (
	geminiPerMinute = "quota_per_minute"
	geminiPerDay    = "quota_per_day"
)

// RetryDelay is a 429 that says in its body when to try again, as Gemini
// does: status RESOURCE_EXHAUSTED with a google.rpc.QuotaFailure on a
// per-minute quota and a google.rpc.RetryInfo whose retryDelay is d in
// seconds ("22s", or "1.5s" for a fraction), and no retry-after header
// (add one with [Step.WithHeader]). OpenAI and Anthropic, which have no
// such body, get their usual 429 without a delay. RetryDelay panics if d
// is negative.
func RetryDelay(d time.Duration) Step {
	if d < 0 {
		panic("llmretrytest: RetryDelay(" + d.String() + "): negative delay")
	}
	st := Status(http.StatusTooManyRequests)
	st.delay = d
	st.errType = "retry_delay"
	return st
}

type geminiErrorJSON struct {
	Error geminiErrorObject `json:"error"`
}

type geminiErrorObject struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Status  string           `json:"status"`
	Details []map[string]any `json:"details,omitempty"`
}

// geminiErrorBody writes Google's error for status. errType is a Google
// status name (RESOURCE_EXHAUSTED) or another provider's type, which is
// replaced by the name status stands for; code says which quota a 429
// names (geminiPerMinute, geminiPerDay); param, when not empty, is the
// RetryInfo's retryDelay.
func geminiErrorBody(status int, errType, code, param, message string) []byte {
	name := errType
	if name == "" || strings.ToUpper(name) != name {
		name = geminiStatus(status)
	}
	e := geminiErrorObject{Code: status, Message: message, Status: name}
	if code == geminiPerMinute || code == geminiPerDay {
		quotaID, metric := "GenerateRequestsPerMinutePerProjectPerModel", "generativelanguage.googleapis.com/generate_content_requests"
		if code == geminiPerDay {
			quotaID, metric = "GenerateRequestsPerDayPerProjectPerModel-FreeTier", "generativelanguage.googleapis.com/generate_content_free_tier_requests"
		}
		e.Details = append(e.Details, map[string]any{
			"@type": "type.googleapis.com/google.rpc.QuotaFailure",
			"violations": []map[string]any{{
				"quotaMetric":     metric,
				"quotaId":         quotaID,
				"quotaDimensions": map[string]string{"location": "global", "model": "gemini"},
				"quotaValue":      "50",
			}},
		})
	}
	if param != "" {
		e.Details = append(e.Details, map[string]any{
			"@type":      "type.googleapis.com/google.rpc.RetryInfo",
			"retryDelay": param,
		})
	}
	return mustJSON(geminiErrorJSON{e})
}

// geminiStatus is the google.rpc status name an HTTP status stands for.
func geminiStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	case http.StatusOK:
		return "OK"
	}
	if status >= 500 {
		return "INTERNAL"
	}
	return "FAILED_PRECONDITION"
}

// geminiError gives the status name, quota, retry delay and message of a
// Gemini error response with status, or of st's own error.
func geminiError(status int, st Step, model string) (errType, code, param, message string) {
	switch st.kind {
	case kindInsufficientQuota:
		// Gemini's spent daily quota carries a RetryInfo too, a delay
		// that no wait of seconds makes good.
		return "RESOURCE_EXHAUSTED", geminiPerDay, "43s",
			"You exceeded your current quota, please check your plan and billing details. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 50"
	case kindContextLength:
		return "INVALID_ARGUMENT", "", "", "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576)."
	case kindStreamError:
		name := st.errType
		if strings.ToUpper(name) != name {
			name = geminiStatus(statusForType(name))
		}
		return name, "", "", "The service encountered an error: " + name + "."
	case kindStatus:
		if st.errType == "retry_delay" {
			return "RESOURCE_EXHAUSTED", geminiPerMinute, geminiSeconds(st.delay), "Resource has been exhausted (e.g. check quota)."
		}
		if st.errType != "" { // refused by the model's limits
			return "RESOURCE_EXHAUSTED", geminiPerMinute, "", "Resource has been exhausted (e.g. check quota)."
		}
	}
	name := geminiStatus(status)
	switch status {
	case http.StatusNotFound:
		return name, "", "", "models/" + model + " is not found for API version v1beta, or is not supported for generateContent."
	case http.StatusTooManyRequests:
		return name, geminiPerMinute, "", "Resource has been exhausted (e.g. check quota)."
	case http.StatusServiceUnavailable:
		return name, "", "", "The model is overloaded. Please try again later."
	case http.StatusUnauthorized, http.StatusForbidden:
		return name, "", "", "API key not valid. Please pass a valid API key."
	}
	if status >= 500 {
		return name, "", "", "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting"
	}
	return name, "", "", "Request contains an invalid argument."
}

// geminiSeconds writes d as a google.protobuf.Duration in JSON: seconds
// with an "s", as "22s" or "1.5s".
func geminiSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

type geminiResponse struct {
	Candidates     []geminiCandidate `json:"candidates,omitempty"`
	UsageMetadata  *geminiUsage      `json:"usageMetadata,omitempty"`
	ModelVersion   string            `json:"modelVersion"`
	ResponseID     string            `json:"responseId"`
	PromptFeedback *struct{}         `json:"promptFeedback,omitempty"` // never sent: a blocked prompt has no step
}

type geminiCandidate struct {
	Content      geminiContent `json:"content"`
	FinishReason string        `json:"finishReason,omitempty"`
	Index        int           `json:"index"`
}

type geminiContent struct {
	Parts []geminiPart `json:"parts,omitempty"`
	Role  string       `json:"role"`
}

// geminiPart is a text part or a functionCall part; a text part's text
// is never empty.
type geminiPart struct {
	Text         string              `json:"text,omitempty"`
	FunctionCall *geminiFunctionCall `json:"functionCall,omitempty"`
}

type geminiFunctionCall struct {
	Name string          `json:"name"`
	Args json.RawMessage `json:"args"`
}

type geminiUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount,omitempty"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount,omitempty"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount,omitempty"`
	TotalTokenCount         int64 `json:"totalTokenCount"`
}

// newGeminiUsage writes u as Gemini counts it: promptTokenCount with the
// cached tokens among its own, and the output split into
// candidatesTokenCount and thoughtsTokenCount, which Gemini counts apart.
func newGeminiUsage(u Usage) *geminiUsage {
	return &geminiUsage{
		PromptTokenCount:        u.InputTokens,
		CachedContentTokenCount: u.CachedInputTokens,
		CandidatesTokenCount:    max(u.OutputTokens-u.ReasoningTokens, 0),
		ThoughtsTokenCount:      u.ReasoningTokens,
		TotalTokenCount:         u.InputTokens + max(u.OutputTokens, u.ReasoningTokens),
	}
}

func geminiID(x *exchange) string {
	return "resp_" + idSafe(x.req.Model) + "_" + strconv.Itoa(x.req.N)
}

// geminiFinish is the finishReason a step ends with; "" (absent) for a
// stream that never finishes.
func geminiFinish(st Step) string {
	switch st.kind {
	case kindTruncated:
		return "MAX_TOKENS"
	case kindRefused:
		return "SAFETY"
	case kindStreamUnfinished:
		return ""
	}
	return "STOP"
}

// geminiChunk is one response: the candidate's text parts and finish
// reason, and the usage so far, as Gemini counts it in every chunk.
func geminiChunk(x *exchange, text string, finish string, u Usage) []byte {
	var parts []geminiPart
	if text != "" {
		parts = []geminiPart{{Text: text}}
	}
	return geminiParts(x, parts, finish, u)
}

// geminiCall is the one response that answers a ToolCall: Gemini sends a
// function call whole, with its finish reason.
func geminiCall(x *exchange, st Step) []byte {
	call := &geminiFunctionCall{Name: st.tool, Args: json.RawMessage(st.text)}
	return geminiParts(x, []geminiPart{{FunctionCall: call}}, geminiFinish(st), answerUsage(st))
}

// geminiParts is one response with parts as the candidate's content.
func geminiParts(x *exchange, parts []geminiPart, finish string, u Usage) []byte {
	return mustJSON(geminiResponse{
		Candidates:    []geminiCandidate{{Content: geminiContent{Parts: parts, Role: "model"}, FinishReason: finish}},
		UsageMetadata: newGeminiUsage(u),
		ModelVersion:  x.req.Model,
		ResponseID:    geminiID(x),
	})
}

func geminiJSON(x *exchange, st Step) []byte {
	if st.kind == kindToolCall {
		return geminiCall(x, st)
	}
	return geminiChunk(x, strings.Join(st.textChunks(), ""), geminiFinish(st), answerUsage(st))
}

func geminiStream(x *exchange, st Step) bool {
	x.startStream(&st)
	if st.kind == kindMalformed {
		return x.event("", []byte(`{"candidates":[{"content":{"parts":[{"text":"Hel`))
	}
	if st.kind == kindStreamError {
		errType, code, param, msg := geminiError(http.StatusOK, st, x.req.Model)
		status := statusForType(errType)
		return x.event("", geminiErrorBody(status, errType, code, param, msg))
	}
	if st.kind == kindToolCall {
		return x.usageEvent(geminiCall(x, st), answerUsage(st))
	}
	texts := st.textChunks()
	finish := geminiFinish(st)
	garble := func() bool { return x.event("", []byte(`{"candidates":[{"content":{"parts":[{"text":"wor`)) }
	fail := func() bool {
		errType, code, param, msg := geminiError(http.StatusOK, StreamError(st.faultType), x.req.Model)
		return x.event("", geminiErrorBody(statusForType(errType), errType, code, param, msg))
	}
	for i, text := range texts {
		// A break at or past the last chunk comes too late: Gemini's
		// last chunk carries the end.
		if st.breaksAt(i, len(texts)) && i < len(texts) {
			return x.broken(st, garble, fail)
		}
		// Every chunk counts the usage so far; the cached tokens are
		// known from the first, the thoughts once the answer is whole.
		last := ""
		u := Usage{InputTokens: inputTokens, OutputTokens: int64(i + 1), CachedInputTokens: st.cached}
		if i == len(texts)-1 && st.kind != kindStreamDrop && st.kind != kindStreamUnfinished && st.kind != kindStreamStall {
			// Gemini sends the finish reason with the last text.
			last, u = finish, answerUsage(st)
		}
		if !x.pause(st, i) || !x.usageEvent(geminiChunk(x, text, last, u), u) {
			return false
		}
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
	if len(texts) == 0 {
		// An answer with no text still ends with its finish reason.
		u := answerUsage(st)
		return x.usageEvent(geminiChunk(x, "", finish, u), u)
	}
	return true
}

// usageEvent writes a data event that tells the client u, logging u as
// sendingUsage does: Gemini sends nothing after its last chunk, so a
// client may be done with the exchange as soon as it has read it.
func (x *exchange) usageEvent(data []byte, u Usage) bool {
	return x.sendingUsage(u, func() bool { return x.event("", data) })
}
