package llmretry

import "context"

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
// plus what the inner chains run under it cost. It is nil when none of
// them is known, and a fresh value otherwise, which the record keeps.
func (a *attemptCtx) cost(failure *Usage) *Usage {
	a.limitsMu.Lock()
	defer a.limitsMu.Unlock()
	own := a.own
	if failure != nil {
		own = failure
	}
	switch {
	case own == nil && a.nested == nil:
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

// TotalUsage sums the usage the attempts' records carry, and counts the
// attempts whose cost is unknown: sent (not skipped), with no Usage, and
// not answered with an HTTP error status (400 and above). Among failures
// those are a timeout or a cut connection, which the provider may have
// billed, and an answer that was billed but came without usage; a
// success among them is one whose backend reported no usage. An attempt
// answered with an error status and no usage is not counted: providers
// do not bill a request they refused.
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
