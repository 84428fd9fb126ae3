package llmretry

import (
	"context"
	"errors"
	"net"
	"syscall"
)

// Usage is what a provider reported that one attempt cost, in tokens. A
// record's Usage is nil when the provider reported none: unknown, which
// is not zero (a timed-out attempt may still have been billed).
type Usage struct {
	InputTokens       int64 `json:"input_tokens"`                  // prompt tokens, cached ones included
	OutputTokens      int64 `json:"output_tokens"`                 // completion tokens, reasoning ones included
	CachedInputTokens int64 `json:"cached_input_tokens,omitempty"` // of InputTokens, read from the provider's cache; 0 when not given
	ReasoningTokens   int64 `json:"reasoning_tokens,omitempty"`    // of OutputTokens, spent on reasoning; 0 when not given
}

// Add returns the field-by-field sum of u and v.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens + v.InputTokens,
		OutputTokens:      u.OutputTokens + v.OutputTokens,
		CachedInputTokens: u.CachedInputTokens + v.CachedInputTokens,
		ReasoningTokens:   u.ReasoningTokens + v.ReasoningTokens,
	}
}

// EstimateInputTokens estimates, without a tokenizer, the input tokens of
// a request whose text (its messages, system prompt and tool definitions
// as JSON) is textBytes bytes of UTF-8 in messages messages: a token for
// every four bytes, rounded up, as the providers' rule of thumb of four
// characters a token has it, and four tokens a message for its framing
// (role and separators). It is what the adapters' [Backend].Estimate
// count, and is there for an Estimate of your own. Bytes rather than
// characters keep text in other scripts, two or three bytes a character
// and often a token or more each, from being estimated at a quarter of a
// token a character. The figure only has to keep a burst of requests
// from overshooting a tokens-per-minute bucket before the provider's
// first report, which corrects it.
func EstimateInputTokens(textBytes, messages int) int64 {
	const bytesPerToken, perMessage = 4, 4
	return int64((textBytes+bytesPerToken-1)/bytesPerToken + perMessage*messages)
}

// ReportUsage tells the chain what the attempt running under ctx cost, as
// the provider reported it: a response's usage block, or a stream's usage
// event. The attempt's record carries it as [Attempt.Usage]. A Call's own
// reports replace one another, the last one winning, since a provider
// reports a running total (a stream's usage events count up to the
// response's); the Usage of a [*Failure] the Call returns replaces them
// all. What the chains a Call runs under the attempt's context cost is
// added to that: each such inner [Chain.Do] reports, when it returns, the
// total of all its attempts, failed ones included, so a Call that runs an
// inner chain twice is charged for both runs. An inner chain run under a
// [Standalone] context, or a context not derived from the attempt's,
// reports to no enclosing attempt, and its error, returned by the Call,
// carries no cost into the record either: its records keep their own.
//
// A backend's Call makes its reports before it returns; one made after is
// not seen. With a nil ctx or a context that is not an attempt's it does
// nothing; in nested chains it reports to the innermost attempt, whose
// backend the response came from. It is safe to call from any goroutine.
func ReportUsage(ctx context.Context, u Usage) {
	if ctx == nil {
		return
	}
	if a, _ := ctx.Value(markKey{}).(*attemptCtx); a != nil {
		a.setUsage(u)
	}
}

// setUsage keeps u as what the attempt's Call reported it cost, replacing
// its earlier report.
func (a *attemptCtx) setUsage(u Usage) {
	a.limitsMu.Lock()
	a.own = &u
	a.limitsMu.Unlock()
}

// addNested adds u, what an inner chain run under the attempt cost, to the
// attempt's cost: each inner call's cost is its own, billed on top of the
// others'.
func (a *attemptCtx) addNested(u Usage) {
	a.limitsMu.Lock()
	defer a.limitsMu.Unlock()
	if a.nested != nil {
		u = a.nested.Add(u)
	}
	a.nested = &u
}

// cost is what the attempt cost: the Call's own report, or failure (the
// Usage of the Failure it returned) in its place when that is not nil,
// plus what the inner chains run under it cost. When none of them is
// known it is zero if err says the request never left (see sentNothing),
// and nil (unknown) otherwise. It is a fresh value, which the record
// keeps.
func (a *attemptCtx) cost(failure *Usage, err error) *Usage {
	a.limitsMu.Lock()
	defer a.limitsMu.Unlock()
	own := a.own
	if failure != nil {
		own = failure
	}
	switch {
	case own == nil && a.nested == nil:
		if sentNothing(err) {
			return &Usage{}
		}
		return nil
	case own == nil:
		u := *a.nested
		return &u
	case a.nested == nil:
		u := *own
		return &u
	}
	u := own.Add(*a.nested)
	return &u
}

// sentNothing reports whether err says that the request certainly never
// reached the provider, which then cannot have billed it: the connection
// was refused, the dial (to the provider or to a proxy) failed or timed
// out, or the host's name did not resolve. A connection reset or cut
// after it was made is not among them: the request may have been sent
// whole. An error that wraps none of these, an inner chain's included
// (its attempts' errors are not in its tree), reports false.
//
// It walks err's tree itself, without errors.As, which would allocate on
// every failed attempt: the first of these errors on a branch decides it,
// and a joined error (a client that tried twice, say) sent nothing only
// when each of its errors says so.
func sentNothing(err error) bool {
	for err != nil {
		switch e := err.(type) {
		case *net.DNSError:
			return true
		case *net.OpError:
			// The first OpError speaks for the connection: a read's or a
			// write's came after it was made.
			return e.Op == "dial" || e.Op == "proxyconnect"
		case syscall.Errno:
			return e == syscall.ECONNREFUSED
		case interface{ Unwrap() []error }:
			errs := e.Unwrap()
			for _, e := range errs {
				if !sentNothing(e) {
					return false
				}
			}
			return len(errs) > 0
		}
		err = errors.Unwrap(err)
	}
	return false
}

// TotalUsage sums the usage the attempts' records carry, and counts the
// attempts whose cost is unknown: sent (not skipped), with no Usage, and
// not answered with an HTTP error status (400 and above). Among failures
// those are a timeout or a cut connection, which the provider may have
// billed, and an answer that was billed but came without usage; a
// success among them is one whose backend reported no usage. An attempt
// answered with an error status and no usage is not counted: providers
// do not bill a request they refused. Nor is one whose request never
// reached the provider (a refused connection, a failed dial or DNS
// lookup): the chain records its Usage as zero, known, not unknown.
func TotalUsage(attempts []Attempt) (total Usage, unknown int) {
	for i := range attempts {
		a := &attempts[i]
		switch {
		case a.Usage != nil:
			total = total.Add(*a.Usage)
		case !a.Skipped && a.Status < 400:
			unknown++
		}
	}
	return total, unknown
}

// knownUsage is the total usage of the attempts that carry one, and
// whether any does.
func knownUsage(attempts []Attempt) (Usage, bool) {
	total, _ := TotalUsage(attempts)
	for i := range attempts {
		if attempts[i].Usage != nil {
			return total, true
		}
	}
	return total, false
}

// usagePtr is the total usage of the attempts, nil when none carries one.
func usagePtr(attempts []Attempt) *Usage {
	if total, ok := knownUsage(attempts); ok {
		return &total
	}
	return nil
}
