package temporalretry

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/llmretry/llmretry"
)

// errNotActivity is Do's error for a context that is not an activity's.
var errNotActivity = errors.New("temporalretry: Do needs the context of an activity")

// Do runs c.Do(ctx, req) inside the activity whose context ctx is, and
// returns its answer, or its error mapped by [ActivityError] for the
// activity to return as it is:
//
//	func (a *Activities) Summarize(ctx context.Context, item Item) (string, error) {
//		return temporalretry.Do(ctx, a.chain, item.Prompt)
//	}
//
// The activity's deadline (its StartToCloseTimeout, or what is left of
// its ScheduleToCloseTimeout) is the chain's deadline: set the policies'
// Reserve explicitly, to a few seconds, as the package documentation
// explains.
//
// While the chain runs, Do heartbeats: when it starts, before each
// request is sent and after each attempt ends, while the chain waits
// (for a retry or a breaker: every quarter of the activity's
// HeartbeatTimeout, or [DefaultHeartbeatEvery] without one), and while a
// stream makes progress, as often, for each [llmretry.Delivered] or
// [llmretry.Progress] call of a backend. A request in flight that makes no
// progress does not heartbeat: a HeartbeatTimeout then ends it, so set it
// longer than the longest a backend may go without output (its
// StallTimeout for a stream, its Timeout for a call that does not
// stream). Each heartbeat's details hold the records so far, so that the
// next run starts where they say (see the package documentation):
// it keeps the earlier runs' records, records a request that a dead run
// left in flight, and first waits out a retry-after the records hold.
//
// Do sets the chain's OnAttemptStart and OnAttempt on a copy of c, and
// calls c's own hooks after its own; c itself is not changed. A ctx that
// is not an activity's gives an error, and no call.
func Do[Req, Resp any](ctx context.Context, c *llmretry.Chain[Req, Resp], req Req) (Resp, error) {
	var zero Resp
	if ctx == nil || !activity.IsActivity(ctx) {
		return zero, errNotActivity
	}
	info := activity.GetInfo(ctx)
	res := resumeFrom(ctx, int(info.Attempt))
	if err := c.Validate(); err != nil {
		return zero, activityError(ctx, err, res.runs)
	}

	b := newBeater(ctx, res.runs)
	b.tick() // carry the earlier runs' records over at once: this run's heartbeats replace theirs
	stop := make(chan struct{})
	defer close(stop)
	go b.run(stop)

	// Should ctx end during the wait, the chain sends nothing and reports
	// it as it reports its own.
	waitOut(ctx, res.previous)

	own := *c
	own.OnAttemptStart = func(ctx context.Context, backend int, model string, try int) context.Context {
		b.start(backend, model, try)
		if c.OnAttemptStart != nil {
			return c.OnAttemptStart(ctx, backend, model, try)
		}
		return ctx
	}
	own.OnAttempt = func(ctx context.Context, a llmretry.Attempt) {
		b.end(a)
		if c.OnAttempt != nil {
			c.OnAttempt(ctx, a)
		}
	}
	resp, err := own.Do(llmretry.OnProgress(ctx, b.progress), req)
	if err == nil {
		return resp, nil
	}
	b.ended(recordOf(err))
	return resp, activityError(ctx, err, res.runs)
}

// waitOut waits, heartbeating, until the provider's retry-after that
// previous, the last earlier run's record, holds has passed: a run that
// died while its chain waited on a provider's hint comes back when the
// provider said, not when Temporal's retry policy did. A wait that would
// end past the activity's deadline is not taken (the chain, which checks
// its deadline before every wait, took none such, so only a run with
// less time than the one before meets it): the chain then runs at once,
// and its own error carries the provider's next hint. It returns early
// when ctx ends.
func waitOut(ctx context.Context, previous json.RawMessage) {
	rec, ok := decodeRecord(previous)
	if !ok {
		return
	}
	// The advice of the chain's records, as the chain's own error would
	// compute it: the soonest time every backend said it would be back.
	d, ok := llmretry.RetryItemAfter(&llmretry.Exhausted{Attempts: rec.Attempts})
	if !ok {
		return
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// recordOf is the run's JSON record of err: the chain's record for its
// four errors, and the redacted text otherwise, as {"error": text}, which
// is how a batch dead letter records an error it has no record of.
func recordOf(err error) json.RawMessage {
	if o, _, ok := outcomeOf(err); ok {
		if data, jerr := json.Marshal(o); jerr == nil {
			return data
		}
	}
	data, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{llmretry.Redact(err.Error())})
	return data
}
