package riverretry

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/llmretry/llmretry"
)

// DefaultMaxSnoozes is how many times [Adapter] snoozes one job on
// retry-after advice when Adapter.MaxSnoozes is zero. A provider that
// still says "later" after that many snoozes is treated as failing: its
// runs use up attempts, and the job is discarded at MaxAttempts.
const DefaultMaxSnoozes = 5

// DefaultMaxSnooze is the longest [Adapter] snoozes a job for when
// Adapter.MaxSnooze is zero. A broken server may send a retry-after of a
// year; the job comes back after this long instead, and asks again.
const DefaultMaxSnooze = time.Hour

// Adapter maps the error of a worker that runs an [llmretry.Chain] onto
// what River should do with the job: cancel it, snooze it, retry it or
// leave it be. Use it as a worker middleware (install it in
// river.Config.Middleware, and existing workers need no change) or call
// [Adapter.Result] on a worker's return value; doing both is harmless,
// since Result leaves an error it has already mapped alone. As
// middleware it sees every job kind of the client; an error that carries
// neither the chain's typed errors nor the advice interfaces
// ([llmretry.ItemRetryable], [llmretry.ItemRetryAfter]) passes through
// unchanged, so other workers behave as before.
//
// The zero Adapter is ready to use: at most [DefaultMaxSnoozes] snoozes
// per job, each at most [DefaultMaxSnooze], and cancellation with
// river.JobCancel. An Adapter must not be changed once in use; it is then
// safe for concurrent use by any number of workers and clients.
type Adapter struct {
	river.MiddlewareDefaults

	// MaxSnoozes is how many times one job may be snoozed on retry-after
	// advice, counted in the job's metadata under [MetadataKey]; once they
	// are used, a failed run's error is returned as is, so it uses up an
	// attempt. Zero means [DefaultMaxSnoozes]; negative means never
	// snooze.
	MaxSnoozes int

	// MaxSnooze caps one snooze: longer advice snoozes the job for
	// MaxSnooze. Zero means [DefaultMaxSnooze].
	MaxSnooze time.Duration

	// CancelByHandler leaves the cancelling of a job that must not run
	// again to an [ErrorHandler] installed as river.Config.ErrorHandler:
	// the error goes back to River as an [*Error], and River stores its
	// text, the chain's JSON record, as the job's error entry. When false,
	// the zero value, the error is wrapped with river.JobCancel, which
	// cancels the job with no handler installed, but River stores the
	// entry as "JobCancelError: " followed by the JSON. Set it only where
	// the ErrorHandler is installed too: without it, a job that must not
	// run again runs until MaxAttempts.
	CancelByHandler bool
}

// Work is the worker middleware: it runs the job with doInner and maps
// the error with [Adapter.Result]. It implements rivertype.WorkerMiddleware.
func (a *Adapter) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	return a.Result(ctx, job, doInner(ctx))
}

// Result maps err, the error of a run of job, onto the error that tells
// River what to do next. Call it from a worker as
//
//	return adapter.Result(ctx, job.JobRow, err)
//
// with the ctx that River gave the worker. By the advice in err's tree
// ([llmretry.RetryItem], [llmretry.RetryItemAfter]):
//
//   - nil: nil, and River completes the job.
//   - an [*llmretry.Cancelled] as the outermost of the chain's typed
//     errors (the worker's context ended; a *Cancelled found only
//     beneath another, in an attempt's record, does not count): err
//     unchanged, and the cancellation counted in the job's metadata.
//     When River's own shutdown (StopAndCancel, or SoftStopTimeout
//     running out) cancelled the context, River makes the job available
//     again without using up an attempt and stores no error; when the
//     job was cancelled through River's API, River cancels it. A
//     cancellation of the worker's own making is stored and retried as
//     any error is.
//   - RetryItem false: river.JobCancel of an [*Error] (or the *Error
//     alone with CancelByHandler), and River cancels the job at once,
//     whatever attempts it has left.
//   - retry-after advice, while the job has snoozes left: river.JobSnooze
//     for that long (at most MaxSnooze), counted in the metadata with the
//     run's record. A snooze uses up no attempt, and stores no error.
//   - otherwise: an [*Error], and River retries the job with its retry
//     policy, or discards it at MaxAttempts.
//
// An err already mapped (an *Error, or River's own snooze or cancel
// error) is returned unchanged, and so is an err that holds none of the
// chain's typed errors where an *Error would be returned. A snooze needs
// River's work context to record its count; outside it (ctx not from
// River), Result returns the *Error instead, since an uncounted snooze
// could repeat forever.
func (a *Adapter) Result(ctx context.Context, job *rivertype.JobRow, err error) error {
	if err == nil {
		return nil
	}
	var (
		mapped  *Error
		snoozed *rivertype.JobSnoozeError
		cancel  *rivertype.JobCancelError
	)
	if errors.As(err, &mapped) || errors.As(err, &snoozed) || errors.As(err, &cancel) {
		return err
	}

	// The outcome is the outermost of the chain's typed errors: a
	// *Cancelled that an attempt's record holds (a chain run inside an
	// attempt, say), or one a layer of the worker's wrapped in another
	// error of ours, is not how the run itself ended.
	var r record
	if errors.As(err, &r) && isCancelled(r) {
		md, _ := JobMetadata(job) // a record we cannot read starts again from zero
		md.Cancellations++
		// The count is a record for people; nothing depends on it, so a
		// context without River's metadata costs nothing but the count.
		_ = river.MetadataSet(ctx, MetadataKey, md)
		// Unchanged: River recognises a run stopped by its own shutdown
		// by a context.Canceled in the error (which Cancelled matches)
		// and then puts the job back without spending an attempt.
		return err
	}

	failed := wrap(err)
	if !llmretry.RetryItem(err) {
		if a.CancelByHandler {
			return failed
		}
		return river.JobCancel(failed)
	}
	if d, ok := llmretry.RetryItemAfter(err); ok {
		if snooze, ok := a.snooze(ctx, job, err, d); ok {
			return snooze
		}
	}
	return failed
}

// snooze records a snooze of d in job's metadata and returns River's
// snooze error; ok is false when the job has no snoozes left or the
// record cannot be kept.
func (a *Adapter) snooze(ctx context.Context, job *rivertype.JobRow, err error, d time.Duration) (_ error, ok bool) {
	md, _ := JobMetadata(job)
	if md.Snoozes >= a.maxSnoozes() {
		return nil, false
	}
	d = min(d, a.maxSnooze())
	md.Snoozes++
	md.LastSnooze = &Snooze{
		At:      time.Now(),
		Attempt: job.Attempt,
		For:     d,
		Error:   json.RawMessage(wrap(err).Error()),
	}
	if !json.Valid(md.LastSnooze.Error) {
		// err holds none of the chain's typed errors: keep its text.
		md.LastSnooze.Error, _ = json.Marshal(llmretry.Redact(err.Error()))
	}
	if river.MetadataSet(ctx, MetadataKey, md) != nil {
		return nil, false
	}
	return river.JobSnooze(d), true
}

func (a *Adapter) maxSnoozes() int {
	switch {
	case a.MaxSnoozes < 0:
		return 0
	case a.MaxSnoozes == 0:
		return DefaultMaxSnoozes
	}
	return a.MaxSnoozes
}

func (a *Adapter) maxSnooze() time.Duration {
	if a.MaxSnooze <= 0 {
		return DefaultMaxSnooze
	}
	return a.MaxSnooze
}

// isCancelled reports whether r, one of the chain's typed errors, is a
// *Cancelled.
func isCancelled(r record) bool {
	_, ok := r.(*llmretry.Cancelled)
	return ok
}

// record is what the chain's typed errors ([*llmretry.Exhausted],
// [*llmretry.Truncated], [*llmretry.TimedOut], [*llmretry.Cancelled])
// have in common: advice and a JSON record. errors.As into it finds the
// outermost one, which answers for everything beneath it.
type record interface {
	error
	json.Marshaler
	llmretry.ItemRetryable
}

// Error is a failed run's error as [Adapter] returns it to River. River
// stores the Error text of a failed run in the job's errors column, so
// the text is the JSON record of the chain's typed error (json.Marshal of
// it: outcome, item_retryable, error, attempts), one line, rather than a
// message for people; errors.Is and errors.As see Err through Unwrap.
//
// The text breaks the usual "riverretry: " form on purpose: a table of
// stored errors reads as JSON, which a query can take apart.
type Error struct {
	// Err is the error the worker returned: one of the chain's typed
	// errors, or an error that wraps one.
	Err error
}

// wrap returns err as an *Error when its tree holds one of the chain's
// typed errors, and err itself otherwise.
func wrap(err error) error {
	var r record
	if !errors.As(err, &r) {
		return err
	}
	return &Error{Err: err}
}

// Error returns the JSON record of the outermost of the chain's typed
// errors in Err's tree. Context that a worker added around it (with
// fmt.Errorf and %w, say) is not in the text. When Err holds no typed
// error, or it cannot be encoded, Error returns Err's own text, and
// "riverretry: nil error" for a nil Err.
func (e *Error) Error() string {
	if e.Err == nil {
		return "riverretry: nil error"
	}
	var r record
	if errors.As(e.Err, &r) {
		if data, err := json.Marshal(r); err == nil {
			return string(data)
		}
	}
	return llmretry.Redact(e.Err.Error())
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// ErrorHandler is a river.ErrorHandler that cancels a job whose error
// advises against running it again ([llmretry.RetryItem] false), by
// returning SetCancelled. Install it as river.Config.ErrorHandler
// together with an [Adapter] whose CancelByHandler is set: River then
// stores the chain's JSON record alone as the cancelled run's error
// entry. (River does not call the handler for an error wrapped with
// river.JobCancel, a snooze, or a run stopped by the client's shutdown.)
//
// The zero ErrorHandler is ready to use, and it is safe for concurrent
// use.
type ErrorHandler struct {
	// Next, when not nil, is called first for every error and panic, so
	// an existing handler (logging, alerts) keeps working; the job is
	// cancelled when Next or the advice says so.
	Next river.ErrorHandler
}

// HandleError asks Next, then cancels the job when err advises against
// running it again. It returns nil when neither asks for anything.
func (h *ErrorHandler) HandleError(ctx context.Context, job *rivertype.JobRow, err error) *river.ErrorHandlerResult {
	var res *river.ErrorHandlerResult
	if h.Next != nil {
		res = h.Next.HandleError(ctx, job, err)
	}
	if err == nil || llmretry.RetryItem(err) {
		return res
	}
	out := river.ErrorHandlerResult{SetCancelled: true}
	if res != nil {
		out = *res // keep whatever else Next asked for
		out.SetCancelled = true
	}
	return &out
}

// HandlePanic returns what Next returns, or nil: a panic carries no
// advice.
func (h *ErrorHandler) HandlePanic(ctx context.Context, job *rivertype.JobRow, panicVal any, trace string) *river.ErrorHandlerResult {
	if h.Next != nil {
		return h.Next.HandlePanic(ctx, job, panicVal, trace)
	}
	return nil
}

var (
	_ rivertype.WorkerMiddleware = (*Adapter)(nil)
	_ river.ErrorHandler         = (*ErrorHandler)(nil)
)
