package llmretry

// Completion is a chat model's answer in a form every provider can fill,
// so that one Chain can fail over from one provider to another. The
// adapters under contrib/ return it; a backend of your own may too.
type Completion struct {
	ID           string // the provider's id of the answer, such as "chatcmpl-123"; "" when it gave none
	Model        string // the model that answered, as the provider named it
	Text         string
	StopReason   string // the provider's own word: "stop", "end_turn", "tool_calls", ...
	InputTokens  int64
	OutputTokens int64
	Raw          any // the provider's own response, e.g. *openai.ChatCompletion
}
