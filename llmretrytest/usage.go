package llmretrytest

import "github.com/llmretry/llmretry"

// Usage is the usage a response told its client, in tokens, as
// [Request].Usage logs it: the core's own type, so a test compares the
// log with a chain's records directly.
type Usage = llmretry.Usage

// answerUsage is the usage of a whole answer to st, as every endpoint's
// JSON body and its stream's last usage event report it.
func answerUsage(st Step) Usage {
	return Usage{InputTokens: inputTokens, OutputTokens: int64(st.outputTokens()), CachedInputTokens: st.cached, ReasoningTokens: st.reasoning}
}

// sendingUsage logs u as the usage the client is told for this request,
// then runs send, which writes the bytes that carry u, and takes the log
// back if send fails: a body cut before its usage block, or a stream cut
// before its usage event, told the client nothing. The log is written
// before the client can read u, so a test that reads the log once the
// client has its answer finds it there. A later report replaces an
// earlier one, as a stream's last usage event gives the total so far.
func (x *exchange) sendingUsage(u Usage, send func() bool) bool {
	x.s.mu.Lock()
	prev := x.req.Usage
	x.s.mu.Unlock()
	x.setUsage(&u)
	if send() {
		return true
	}
	x.setUsage(prev)
	return false
}

// setUsage logs u (nil: none) as the usage of this exchange.
func (x *exchange) setUsage(u *Usage) {
	if _, ok := x.w.(*recorder); ok {
		// A body rendered ahead of time for fill: nothing is sent yet.
		return
	}
	x.s.mu.Lock()
	defer x.s.mu.Unlock()
	x.req.Usage = u
	var c *Usage
	if u != nil {
		v := *u // the log's own copy, apart from x.req's
		c = &v
	}
	x.s.log[x.logged].Usage = c
}
