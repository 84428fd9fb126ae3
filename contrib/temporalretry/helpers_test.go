package temporalretry_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/llmretry/llmretry"
)

// The chains under test take and give strings.
type (
	chain   = llmretry.Chain[string, string]
	backend = llmretry.Backend[string, string]
)

// step is how one call of a fake backend ends.
type step func(ctx context.Context) (string, error)

// fake is a scripted backend: call n plays steps[n-1], and the last step
// repeats. It records when each call was sent.
type fake struct {
	steps []step

	mu   sync.Mutex
	sent []time.Time
}

func newFake(steps ...step) *fake { return &fake{steps: steps} }

func (f *fake) call(ctx context.Context, _ string) (string, error) {
	f.mu.Lock()
	n := len(f.sent)
	f.sent = append(f.sent, time.Now())
	s := f.steps[min(n, len(f.steps)-1)]
	f.mu.Unlock()
	return s(ctx)
}

// calls returns when each call was sent.
func (f *fake) calls() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.sent...)
}

func answer(text string) step {
	return func(context.Context) (string, error) { return text, nil }
}

func fail(err error) step {
	return func(context.Context) (string, error) { return "", err }
}

// status fails with an HTTP status, and a Retry-After header when
// retryAfter is not "".
func status(code int, retryAfter string) step {
	h := http.Header{}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return fail(llmretry.StatusFailure(code, h, nil))
}

// stream hands over chunks, one every every, and answers.
func stream(chunks int, every time.Duration) step {
	return func(ctx context.Context) (string, error) {
		for range chunks {
			if err := sleep(ctx, every); err != nil {
				return "", err
			}
			llmretry.Delivered(ctx)
		}
		return "streamed", nil
	}
}

// silent answers after d, saying nothing before.
func silent(d time.Duration) step {
	return func(ctx context.Context) (string, error) {
		if err := sleep(ctx, d); err != nil {
			return "", err
		}
		return "silent", nil
	}
}

// hang returns only when ctx is done.
func hang(ctx context.Context) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// die panics: the run ends without a word while its request is in flight.
func die(context.Context) (string, error) { panic("the worker died") }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heartbeat is the details of one heartbeat, decoded by the test from
// their JSON: it pins the format that runs read.
type heartbeat struct {
	At      time.Time         `json:"-"`
	V       int               `json:"v"`
	Run     int               `json:"run"`
	Earlier []json.RawMessage `json:"earlier"`
	Omitted int               `json:"omitted"`
	Record  record            `json:"record"`
	Ended   bool              `json:"ended"`
}

// record is a chain's JSON record, as the test reads it.
type record struct {
	Outcome       string             `json:"outcome"`
	ItemRetryable bool               `json:"item_retryable"`
	Error         string             `json:"error"`
	Attempts      []llmretry.Attempt `json:"attempts"`
}

func decodeRecord(t *testing.T, data []byte) record {
	t.Helper()
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("decoding record %s: %v", data, err)
	}
	return r
}

// beats records every heartbeat an activity records, as an activity
// interceptor sees it: before the SDK throttles what it sends.
type beats struct {
	interceptor.WorkerInterceptorBase
	t *testing.T

	mu   sync.Mutex
	list []heartbeat
}

func (b *beats) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &beatsIn{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, b: b}
}

type beatsIn struct {
	interceptor.ActivityInboundInterceptorBase
	b *beats
}

func (i *beatsIn) Init(out interceptor.ActivityOutboundInterceptor) error {
	return i.Next.Init(&beatsOut{ActivityOutboundInterceptorBase: interceptor.ActivityOutboundInterceptorBase{Next: out}, b: i.b})
}

type beatsOut struct {
	interceptor.ActivityOutboundInterceptorBase
	b *beats
}

func (o *beatsOut) RecordHeartbeat(ctx context.Context, details ...any) {
	h := heartbeat{At: time.Now()}
	if len(details) != 1 {
		o.b.t.Errorf("RecordHeartbeat with %d details, want 1", len(details))
	} else if data, err := json.Marshal(details[0]); err != nil {
		o.b.t.Errorf("encoding heartbeat details: %v", err)
	} else if err := json.Unmarshal(data, &h); err != nil {
		o.b.t.Errorf("decoding heartbeat details %s: %v", data, err)
	}
	o.b.mu.Lock()
	o.b.list = append(o.b.list, h)
	o.b.mu.Unlock()
	o.Next.RecordHeartbeat(ctx, details...)
}

// seen returns the heartbeats so far.
func (b *beats) seen() []heartbeat {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]heartbeat(nil), b.list...)
}

// since returns the heartbeats' times, measured from t0.
func since(t0 time.Time, hs []heartbeat) []time.Duration {
	out := make([]time.Duration, len(hs))
	for i, h := range hs {
		out[i] = h.At.Sub(t0)
	}
	return out
}

// quiet drops the SDK's logs: the tests check what they need, and the
// expected failures would fill the output.
var quiet = log.NewStructuredLogger(slog.New(slog.DiscardHandler))

// activityEnv returns a test activity environment whose heartbeats b
// records.
func activityEnv(t *testing.T, b *beats) *testsuite.TestActivityEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(quiet)
	env := s.NewTestActivityEnvironment()
	if b != nil {
		b.t = t
		env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{b}})
	}
	return env
}

// workflowEnv returns a test workflow environment whose heartbeats b
// records.
func workflowEnv(t *testing.T, b *beats) *testsuite.TestWorkflowEnvironment {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(quiet)
	env := s.NewTestWorkflowEnvironment()
	// The environment's idle timeout is in real time, which synctest makes
	// virtual: an activity that waits a minute must not end the test.
	env.SetTestTimeout(time.Hour)
	if b != nil {
		b.t = t
		env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{b}})
	}
	return env
}
