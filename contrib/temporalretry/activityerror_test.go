package temporalretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/contrib/temporalretry"
)

// Each rule of the mapping, run in the SDK's activity environment, both
// through Do and through ActivityError on the chain's own error: the
// error Temporal gets has the type, retryability and next retry delay
// the rule says, and carries the chain's JSON record and the runs.
func TestActivityErrorMapping(t *testing.T) {
	tests := []struct {
		name     string
		backends func() []backend
		// cancel, when set, cancels the activity's context with this
		// cause before the chain runs, as the SDK does.
		cancel        error
		wantType      string
		wantNonRetry  bool
		wantDelay     time.Duration
		wantOutcome   string
		wantRetryable bool
	}{
		{
			name:     "truncated",
			backends: one(fail(llmretry.Truncation("The answer was"))),
			wantType: temporalretry.TypeTruncated, wantNonRetry: true,
			wantOutcome: "truncated",
		},
		{
			name: "refused_by_every_backend",
			backends: func() []backend {
				return []backend{
					{Model: "a", Call: newFake(status(400, "")).call},
					{Model: "b", Call: newFake(status(400, "")).call},
				}
			},
			wantType: temporalretry.TypeExhausted, wantNonRetry: true,
			wantOutcome: "exhausted",
		},
		{
			name:     "retry_after",
			backends: one(status(429, "30")),
			wantType: temporalretry.TypeExhausted, wantDelay: 30 * time.Second,
			wantOutcome: "exhausted", wantRetryable: true,
		},
		{
			name:     "retry_after_past_the_cap",
			backends: one(status(429, "86400")),
			wantType: temporalretry.TypeExhausted, wantDelay: temporalretry.MaxRetryDelay,
			wantOutcome: "exhausted", wantRetryable: true,
		},
		{
			name:        "transient",
			backends:    one(status(503, "")),
			wantType:    temporalretry.TypeExhausted,
			wantOutcome: "exhausted", wantRetryable: true,
		},
		{
			name: "timed_out",
			backends: func() []backend {
				return []backend{{Model: "a", Call: newFake(hang).call, Timeout: time.Second}}
			},
			wantType:    temporalretry.TypeTimedOut,
			wantOutcome: "timed_out", wantRetryable: true,
		},
		{
			name:        "cancelled_by_worker_shutdown",
			backends:    one(hang),
			cancel:      worker.ErrWorkerShutdown,
			wantType:    temporalretry.TypeCancelled,
			wantOutcome: "cancelled", wantRetryable: true,
		},
	}
	for _, tc := range tests {
		for _, via := range []string{"Do", "ActivityError"} {
			t.Run(tc.name+"/"+via, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					c := &chain{Backends: tc.backends()}
					var chainErr error
					run := func(ctx context.Context) (string, error) {
						if tc.cancel != nil {
							var cancel context.CancelCauseFunc
							ctx, cancel = context.WithCancelCause(ctx)
							cancel(tc.cancel)
						}
						if via == "Do" {
							// The chain's own error, for the record to compare
							// with: the same chain, run alone, gives the same.
							_, chainErr = c.Do(ctx, "hi")
							return temporalretry.Do(ctx, c, "hi")
						}
						answer, err := c.Do(ctx, "hi")
						chainErr = err
						return answer, temporalretry.ActivityError(ctx, err)
					}
					env := activityEnv(t, nil)
					env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
					_, err := env.ExecuteActivity("run")

					var app *temporal.ApplicationError
					if !errors.As(err, &app) {
						t.Fatalf("ExecuteActivity() = %v (%T), want an ApplicationError", err, err)
					}
					if app.Type() != tc.wantType || app.NonRetryable() != tc.wantNonRetry || app.NextRetryDelay() != tc.wantDelay {
						t.Errorf("ApplicationError type %q, non-retryable %v, next retry delay %v; want %q, %v, %v",
							app.Type(), app.NonRetryable(), app.NextRetryDelay(), tc.wantType, tc.wantNonRetry, tc.wantDelay)
					}
					var (
						raw  json.RawMessage
						runs temporalretry.Runs
					)
					if err := app.Details(&raw, &runs); err != nil {
						t.Fatalf("Details() = %v", err)
					}
					want, err := json.Marshal(chainErr)
					if err != nil {
						t.Fatalf("json.Marshal(chain's error) = %v", err)
					}
					// Do's chain ran after the chain alone: only the start
					// times differ.
					if noStart(raw) != noStart(want) {
						t.Errorf("first detail = %s\nwant the chain's record %s", raw, want)
					}
					if rec := decodeRecord(t, raw); rec.Outcome != tc.wantOutcome || rec.ItemRetryable != tc.wantRetryable {
						t.Errorf("record outcome %q, item_retryable %v; want %q, %v", rec.Outcome, rec.ItemRetryable, tc.wantOutcome, tc.wantRetryable)
					}
					if diff := cmp.Diff(temporalretry.Runs{Run: 1, Earlier: []json.RawMessage{}}, runs); diff != "" {
						t.Errorf("second detail (-want +got):\n%s", diff)
					}
					if app.Message() != chainErr.Error() {
						t.Errorf("message = %q, want the chain's error text %q", app.Message(), chainErr.Error())
					}
				})
			})
		}
	}
}

var startKey = regexp.MustCompile(`"start":"[^"]*"`)

// noStart is a record's JSON without its attempts' start times.
func noStart(data []byte) string { return startKey.ReplaceAllString(string(data), `"start":""`) }

// one is a chain of one backend that plays steps.
func one(steps ...step) func() []backend {
	return func() []backend { return []backend{{Model: "a", Call: newFake(steps...).call}} }
}

// A *Cancelled while Temporal has asked to cancel the activity (the SDK
// cancels its context with a CanceledError as the cause) comes back as
// Temporal's CanceledError, with the record and the runs as details.
func TestActivityErrorCancelledByTemporal(t *testing.T) {
	for _, via := range []string{"Do", "ActivityError"} {
		t.Run(via, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &chain{Backends: []backend{{Model: "a", Call: newFake(hang).call}}}
				var got error
				run := func(ctx context.Context) error {
					ctx, cancel := context.WithCancelCause(ctx)
					time.AfterFunc(time.Second, func() { cancel(temporal.NewCanceledError()) })
					if via == "Do" {
						_, got = temporalretry.Do(ctx, c, "hi")
					} else {
						_, err := c.Do(ctx, "hi")
						got = temporalretry.ActivityError(ctx, err)
					}
					return nil // the SDK would answer Temporal's cancel with got: it is what is checked
				}
				env := activityEnv(t, nil)
				env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
				if _, err := env.ExecuteActivity("run"); err != nil {
					t.Fatalf("ExecuteActivity() = %v", err)
				}
				var canceled *temporal.CanceledError
				if !errors.As(got, &canceled) {
					t.Fatalf("error = %v (%T), want a CanceledError", got, got)
				}
				var (
					raw  json.RawMessage
					runs temporalretry.Runs
				)
				if err := canceled.Details(&raw, &runs); err != nil {
					t.Fatalf("Details() = %v", err)
				}
				rec := decodeRecord(t, raw)
				if rec.Outcome != "cancelled" || len(rec.Attempts) != 1 || rec.Attempts[0].Kind != llmretry.KindCancelled {
					t.Errorf("record = %+v, want cancelled with the interrupted attempt", rec)
				}
				if runs.Run != 1 {
					t.Errorf("runs = %+v, want run 1", runs)
				}
			})
		})
	}
}

// Errors that hold none of the chain's are mapped by their advice alone,
// and Temporal's own errors pass through.
func TestActivityErrorForeign(t *testing.T) {
	plain := errors.New("disk full")
	mapped := temporal.NewApplicationError("mapped", "Mine")
	tests := []struct {
		name         string
		err          error
		wantSame     bool
		wantType     string
		wantNonRetry bool
		wantDelay    time.Duration
	}{
		{name: "nil"},
		{name: "no_advice", err: plain, wantSame: true},
		{name: "temporal_error", err: mapped, wantSame: true},
		{name: "not_retryable", err: (&chain{}).Validate(), wantType: "configError", wantNonRetry: true},
		{name: "retry_after", err: advice{after: time.Minute}, wantType: "advice", wantDelay: time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got error
			run := func(ctx context.Context) error {
				got = temporalretry.ActivityError(ctx, tc.err)
				return nil
			}
			env := activityEnv(t, nil)
			env.RegisterActivityWithOptions(run, activity.RegisterOptions{Name: "run"})
			if _, err := env.ExecuteActivity("run"); err != nil {
				t.Fatalf("ExecuteActivity() = %v", err)
			}
			if tc.err == nil || tc.wantSame {
				if got != tc.err {
					t.Errorf("ActivityError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			var app *temporal.ApplicationError
			if !errors.As(got, &app) {
				t.Fatalf("ActivityError(%v) = %v (%T), want an ApplicationError", tc.err, got, got)
			}
			if app.Type() != tc.wantType || app.NonRetryable() != tc.wantNonRetry || app.NextRetryDelay() != tc.wantDelay || app.Message() != tc.err.Error() {
				t.Errorf("ApplicationError %q type %q, non-retryable %v, delay %v; want %q, %q, %v, %v",
					app.Message(), app.Type(), app.NonRetryable(), app.NextRetryDelay(), tc.err.Error(), tc.wantType, tc.wantNonRetry, tc.wantDelay)
			}
		})
	}
}

// advice is an error of another library that advises a wait.
type advice struct{ after time.Duration }

func (a advice) Error() string                 { return "busy" }
func (a advice) ItemRetryAfter() time.Duration { return a.after }

// Do outside an activity returns an error and calls nothing.
func TestDoOutsideAnActivity(t *testing.T) {
	f := newFake(answer("hi"))
	c := &chain{Backends: []backend{{Model: "a", Call: f.call}}}
	if _, err := temporalretry.Do(context.Background(), c, "hi"); err == nil {
		t.Errorf("Do(context.Background()) = nil error, want one")
	}
	if n := len(f.calls()); n != 0 {
		t.Errorf("backend called %d times, want 0", n)
	}
}
