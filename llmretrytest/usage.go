package llmretrytest

// Usage is the usage a response told its client, in tokens, as
// [Request].Usage logs it. Its fields are those of llmretry.Usage, in
// the same order, so a test converts one into the other with
// llmretry.Usage(u); this package does not import llmretry, whose own
// tests use it.
type Usage struct {
	InputTokens       int64 // the prompt's: always 10, as the server does not tokenize
	OutputTokens      int64 // one per text chunk, or what a stream has reported so far
	CachedInputTokens int64 // 0 unless the step sets it (Step.WithUsageDetails)
	ReasoningTokens   int64 // 0 unless the step sets it (Step.WithUsageDetails)
}

// answerUsage is the usage of a whole answer to st, as every endpoint's
// JSON body and its stream's last usage event report it.
func answerUsage(st Step) Usage {
	return Usage{InputTokens: inputTokens, OutputTokens: int64(len(st.textChunks())), CachedInputTokens: st.cached, ReasoningTokens: st.reasoning}
}

// reportUsage logs u as the usage the client has been told for this
// request. Call it once the bytes that carry u have been written: a body
// cut before its usage block, or a stream cut before its usage event,
// told the client nothing. A later report replaces an earlier one, as a
// stream's last usage event gives the total so far.
func (x *exchange) reportUsage(u Usage) {
	if _, ok := x.w.(*recorder); ok {
		// A body rendered ahead of time for fill: nothing is sent yet.
		return
	}
	x.s.mu.Lock()
	defer x.s.mu.Unlock()
	x.req.Usage = &u
	c := u // the log's own copy, apart from x.req's
	x.s.log[x.logged].Usage = &c
}
