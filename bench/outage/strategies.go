package outage

import (
	"context"
	"encoding/json"
	"errors"
	mathrand "math/rand"
	"net/http"
	"strconv"
	"strings"
	"time"

	retrygo "github.com/avast/retry-go/v4"
	"github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/fallback"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goretry "github.com/sethvargo/go-retry"

	"github.com/llmretry/llmretry"
)

// The common budget, where a library has the knob: waits of 1, 2, 4 and
// 8 s (four retries per backend), 30 s per attempt, and under a deadline
// 60 s of it for the primary.
const (
	firstWait      = time.Second
	lastWait       = 8 * time.Second
	retries        = 4
	attemptTimeout = 30 * time.Second
	primaryBudget  = 60 * time.Second
)

// Strategy is one way of sending a request: a library set up for "retry
// the primary, then fall back to the secondary".
type Strategy struct {
	Name    string
	Peer    bool // one of the libraries llmretry is compared with
	Breaker bool // llmretry with its Breaker: the rows the targets are for
	Paced   bool // of the Breaker rows, the one whose Breakers pace by the rate-limit headers
	build   func(e *Env) doFunc
}

// The strategies' names, as the tables print them.
const (
	nameLLMRetry     = "llmretry"
	nameBreaker      = "llmretry + Breaker"
	namePaced        = "llmretry + Breaker, paced"
	nameFailsafe     = "failsafe-go"
	nameFailsafeCB   = "failsafe-go + CircuitBreaker"
	nameBackoffTries = "backoff v5 (max tries)"
	nameBackoffTime  = "backoff v5 (time only)"
	nameRetryGo      = "retry-go v4"
	nameGoRetry      = "go-retry"
	nameOpenAI       = "openai-go (default retries)"
)

// Env is what a strategy is built from for one run: the providers'
// transports and whether callers have a deadline. What a strategy shares
// across calls (breakers, clients) it builds once per run from it.
type Env struct {
	seed       uint64
	deadline   bool
	transports []http.RoundTripper // by provider, in the scenario's order
	urls       []string
	sc         *Scenario
	calls      []*caller // the callers, for what a request asks of the pool strategies (its input, its budget)

	storeCalls func() int64 // the calls a strategy made to its shared store, for Result.StoreCalls; nil: none
}

// client is an HTTP client for backend b. timeout is http.Client's own
// per-request limit, given to the libraries that have no per-attempt
// timeout of their own: it is how a Go program bounds one request.
func (e *Env) client(b int, timeout time.Duration) *http.Client {
	return &http.Client{Transport: e.transports[b], Timeout: timeout}
}

// send posts request id to backend b, as a chat completion request.
func (e *Env) send(ctx context.Context, c *http.Client, b, id int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.urls[b]+"chat/completions",
		strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"question"}]}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idHeader, strconv.Itoa(id))
	return c.Do(req)
}

// errTruncated is an answer cut off at its completion budget: no answer.
var errTruncated = errors.New("outage: answer truncated at its completion budget")

// statusError is an HTTP error response, for the libraries whose idiom is
// an error value.
type statusError struct{ code int }

func (e *statusError) Error() string { return "outage: http " + strconv.Itoa(e.code) }

// retryable is the usual rule: 408, 429 and 5xx may pass.
func (e *statusError) retryable() bool {
	return e.code == http.StatusRequestTimeout || e.code == http.StatusTooManyRequests || e.code >= 500
}

// readAnswer reads a 200's chat completion and reports which provider
// answered; any other status, or a truncated answer, is an error.
func readAnswer(resp *http.Response) (int, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return -1, &statusError{resp.StatusCode}
	}
	var c struct {
		Model   string `json:"model"`
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return -1, err
	}
	if len(c.Choices) == 0 || c.Choices[0].FinishReason == "length" {
		return -1, errTruncated
	}
	return providerIndex(c.Model), nil
}

// providerIndex maps a model name from a response to its backend.
func providerIndex(model string) int {
	if model == "Primary" {
		return 0
	}
	return 1
}

// failOver is the plain loop over the two backends for libraries that
// have no fallback of their own: the secondary is tried when the primary
// gave up and the caller is still waiting.
func failOver(try func(ctx context.Context, b, id int) (int, error)) doFunc {
	return func(ctx context.Context, id int) (int, error) {
		by, err := try(ctx, 0, id)
		if err == nil || ctx.Err() != nil {
			return by, err
		}
		return try(ctx, 1, id)
	}
}

// primaryContext is the primary's share of a deadline, for the libraries
// whose time knob is the context.
func (e *Env) primaryContext(ctx context.Context, b int) (context.Context, context.CancelFunc) {
	if b == 0 && e.deadline {
		return context.WithTimeout(ctx, primaryBudget)
	}
	return ctx, func() {}
}

// Strategies returns every strategy in the order of the tables: llmretry
// first (with its Breaker, without and with pacing, when this build has
// it), then the peers.
func Strategies() []Strategy {
	s := []Strategy{{Name: nameLLMRetry, build: buildLLMRetry(false)}}
	if breakerBuilt {
		s = append(s,
			Strategy{Name: nameBreaker, Breaker: true, build: buildLLMRetry(true)},
			Strategy{Name: namePaced, Breaker: true, Paced: true, build: buildLLMRetryPaced})
	}
	return append(s,
		Strategy{Name: nameFailsafe, Peer: true, build: buildFailsafe(false)},
		Strategy{Name: nameFailsafeCB, Peer: true, build: buildFailsafe(true)},
		Strategy{Name: nameBackoffTries, Peer: true, build: buildBackoff(true)},
		Strategy{Name: nameBackoffTime, Peer: true, build: buildBackoff(false)},
		Strategy{Name: nameRetryGo, Peer: true, build: buildRetryGo},
		Strategy{Name: nameGoRetry, Peer: true, build: buildGoRetry},
		Strategy{Name: nameOpenAI, Peer: true, build: buildOpenAI},
	)
}

// buildLLMRetry is a Chain of two Backends, as llmretry's docs show, each
// with the waits 1, 2, 4, 8 s and a 30 s Timeout. Under a deadline the
// waits are a floor, not a count: the last wait repeats while the
// Reserve still fits (llmretry's own time knob), so the primary's
// Reserve of 30 s gives it the first 60 s of a 90 s deadline. The
// secondary's Reserve of 3 s is the time one of its answers takes, which
// is what the docs say the reserve is for: room for one more request to
// finish. Without a deadline the waits are the bound: four retries.
// Retry-after is read by StatusFailure and honoured by the chain. With
// breakers, each backend gets a default Breaker shared by every call, but
// with NoPacing set: StatusFailure also reads the buckets' rate-limit
// headers from every 429, and a Breaker that paced by them would no
// longer be the Breaker this row has always measured. This row is the
// Breaker without pacing, kept to compare with buildLLMRetryPaced's.
func buildLLMRetry(breakers bool) func(e *Env) doFunc {
	mode := noBreakers
	if breakers {
		mode = unpacedBreakers
	}
	return llmRetryChain(mode)
}

// buildLLMRetryPaced is buildLLMRetry's chain with a zero Breaker on each
// backend, which paces: each Call passes every response's header to
// llmretry.ReportLimits, 200s included (StatusFailure reads the 429s'
// too), so each Breaker holds back what its bucket would refuse.
func buildLLMRetryPaced(e *Env) doFunc { return llmRetryChain(pacedBreakers)(e) }

// The breakers an llmRetryChain gives its backends.
const (
	noBreakers      = iota
	unpacedBreakers // a default Breaker with NoPacing
	pacedBreakers   // a zero Breaker, fed every response's rate-limit headers
)

// llmRetryChain builds buildLLMRetry's chain with the given breakers.
func llmRetryChain(mode int) func(e *Env) doFunc {
	return func(e *Env) doFunc { return llmRetryChainOf(e, mode, nil, 0) }
}

// llmRetryChainOf is llmRetryChain's chain for e; with store, its
// Breakers keep their state there, each backend under its own key, as
// every process of a fleet does.
func llmRetryChainOf(e *Env, mode int, store llmretry.BreakerStore, storeTimeout time.Duration) doFunc {
	waits := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	call := func(b int) func(ctx context.Context, id int) (int, error) {
		c := e.client(b, 0)
		return func(ctx context.Context, id int) (int, error) {
			resp, err := e.send(ctx, c, b, id)
			if err != nil {
				return -1, err
			}
			if mode == pacedBreakers {
				llmretry.ReportLimits(ctx, resp.Header)
			}
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return -1, llmretry.StatusFailure(resp.StatusCode, resp.Header, nil)
			}
			by, err := readAnswer(resp)
			if errors.Is(err, errTruncated) {
				return -1, llmretry.Truncation("")
			}
			return by, err
		}
	}
	chain := &llmretry.Chain[int, int]{Backends: []llmretry.Backend[int, int]{
		{Model: "primary", Call: call(0), Timeout: attemptTimeout,
			Retry: llmretry.Policy{Waits: waits, Reserve: 30 * time.Second}},
		{Model: "secondary", Call: call(1), Timeout: attemptTimeout,
			Retry: llmretry.Policy{Waits: waits, Reserve: secondaryAnswer}},
	}}
	if mode != noBreakers {
		for i := range chain.Backends {
			addBreaker(&chain.Backends[i], mode == pacedBreakers)
			if store != nil {
				chain.Backends[i].Breaker.Store, chain.Backends[i].Breaker.Key = store, chain.Backends[i].Model
				chain.Backends[i].Breaker.StoreTimeout = storeTimeout
			}
		}
	}
	return chain.Do
}

// idKey carries the request's number to failsafe-go's fallback function,
// which is built once and gets only the execution.
type idKey struct{}

// buildFailsafe follows failsafe-go's HTTP docs: failsafehttp's retry
// policy builder (it retries 429, 5xx and transport errors, and takes its
// delay from a Retry-After header through failsafehttp.DelayFunc), set to
// four retries with backoff from 1 s doubling to 8 s; a Timeout policy of
// 30 s inside it, so each attempt gets its own; the secondary reached
// through a Fallback outside the retry policy. Under a deadline the
// primary's retry policy gets WithMaxDuration(60 s), failsafe-go's own
// time knob. Policies are built once per run and shared by every call, as
// failsafe-go allows; the fallback finds the request's number in the
// execution's context.
//
// With circuit breakers, each backend also gets a CircuitBreaker between
// the retry policy and the timeout (the order failsafe-go's docs give:
// Fallback, RetryPolicy, CircuitBreaker, Timeout), set to the numbers of
// llmretry's default Breaker (open after 5 consecutive failures, for
// 30 s) and to failsafehttp.DelayFunc, which the docs offer for a
// breaker's delay, so that a Retry-After opens it for that long. The
// retry policy aborts on circuitbreaker.ErrOpen so that an open breaker
// falls back at once instead of spending the retry waits on rejections.
func buildFailsafe(breakers bool) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		attempt := func(b, id int) func(exec failsafe.Execution[*http.Response]) (*http.Response, error) {
			c := e.client(b, 0)
			return func(exec failsafe.Execution[*http.Response]) (*http.Response, error) {
				return e.send(exec.Context(), c, b, id)
			}
		}
		policies := func(b int) []failsafe.Policy[*http.Response] {
			rb := failsafehttp.NewRetryPolicyBuilder().
				WithMaxRetries(retries).
				WithBackoff(firstWait, lastWait)
			if b == 0 && e.deadline {
				rb = rb.WithMaxDuration(primaryBudget)
			}
			if breakers {
				rb = rb.AbortOnErrors(circuitbreaker.ErrOpen)
			}
			ps := []failsafe.Policy[*http.Response]{rb.Build()}
			if breakers {
				ps = append(ps, circuitbreaker.NewBuilder[*http.Response]().
					HandleIf(func(resp *http.Response, err error) bool {
						return err != nil || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
					}).
					WithFailureThreshold(5).
					WithDelay(30*time.Second).
					WithDelayFunc(failsafehttp.DelayFunc).
					Build())
			}
			return append(ps, timeout.New[*http.Response](attemptTimeout))
		}
		secondary := failsafe.With(policies(1)...)
		fb := fallback.NewWithFunc(func(exec failsafe.Execution[*http.Response]) (*http.Response, error) {
			id := exec.Context().Value(idKey{}).(int)
			return secondary.WithContext(exec.Context()).GetWithExecution(attempt(1, id))
		})
		primary := failsafe.With(append([]failsafe.Policy[*http.Response]{fb}, policies(0)...)...)
		return func(ctx context.Context, id int) (int, error) {
			ctx = context.WithValue(ctx, idKey{}, id)
			resp, err := primary.WithContext(ctx).GetWithExecution(attempt(0, id))
			if err != nil {
				if resp != nil {
					resp.Body.Close()
				}
				return -1, err
			}
			return readAnswer(resp)
		}
	}
}

// buildBackoff follows backoff's README: Retry with an exponential
// backoff and, on a 429, backoff.RetryAfter with the header's seconds,
// exactly as the README's example does. The backoff starts at 1 s and
// doubles to 8 s with no randomization (1, 2, 4, 8 s); it keeps state, so
// it is made per call. backoff has no per-attempt timeout, so the HTTP
// client's Timeout (30 s) bounds each request, and no fallback, so a plain
// loop tries the secondary.
//
// maxTries: WithMaxTries(5), four retries; under a deadline the primary
// also gets WithMaxElapsedTime(60 s), backoff's time knob. Otherwise
// (time only): no count at all, the way backoff bounds retries by
// default; the primary gets WithMaxElapsedTime(60 s) with or without a
// deadline (its default of 15 minutes would keep a batch on a dead
// primary for a quarter of an hour), the secondary keeps the default and
// the caller's deadline.
func buildBackoff(maxTries bool) func(e *Env) doFunc {
	return func(e *Env) doFunc {
		clients := [2]*http.Client{e.client(0, attemptTimeout), e.client(1, attemptTimeout)}
		return failOver(func(ctx context.Context, b, id int) (int, error) {
			bo := &backoff.ExponentialBackOff{InitialInterval: firstWait, Multiplier: 2, MaxInterval: lastWait}
			opts := []backoff.RetryOption{backoff.WithBackOff(bo)}
			if maxTries {
				opts = append(opts, backoff.WithMaxTries(retries+1))
			}
			if b == 0 && (e.deadline || !maxTries) {
				opts = append(opts, backoff.WithMaxElapsedTime(primaryBudget))
			}
			resp, err := backoff.Retry(ctx, func() (*http.Response, error) {
				resp, err := e.send(ctx, clients[b], b, id)
				if err != nil {
					return nil, err
				}
				if resp.StatusCode == http.StatusOK {
					return resp, nil
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					if s, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64); err == nil {
						return nil, backoff.RetryAfter(int(s))
					}
				}
				serr := &statusError{resp.StatusCode}
				if !serr.retryable() {
					return nil, backoff.Permanent(serr)
				}
				return nil, serr
			}, opts...)
			if err != nil {
				return -1, err
			}
			return readAnswer(resp)
		})
	}
}

// retryAfterError is retry-go's documented pattern for a server's hint: an
// error that carries the wait, read back by a custom DelayType.
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// buildRetryGo follows retry-go v4's docs: DoWithData with Attempts(5)
// (four retries), Delay(1 s) and a DelayType that returns the 429's
// Retry-After when there is one and BackOffDelay (1, 2, 4, 8 s) otherwise,
// as the library's own example of a delay based on the error does; that
// also leaves out the default's random jitter. Errors that are not
// retryable are Unrecoverable. retry-go's time knob is its Context
// option: under a deadline the primary's context ends after 60 s. It has
// no per-attempt timeout and no fallback: the HTTP client's 30 s Timeout
// and a plain loop stand in.
func buildRetryGo(e *Env) doFunc {
	clients := [2]*http.Client{e.client(0, attemptTimeout), e.client(1, attemptTimeout)}
	delay := func(n uint, err error, config *retrygo.Config) time.Duration {
		var ra *retryAfterError
		if errors.As(err, &ra) {
			return ra.after
		}
		return retrygo.BackOffDelay(n, err, config)
	}
	return failOver(func(ctx context.Context, b, id int) (int, error) {
		ctx, cancel := e.primaryContext(ctx, b)
		defer cancel()
		resp, err := retrygo.DoWithData(func() (*http.Response, error) {
			resp, err := e.send(ctx, clients[b], b, id)
			if err != nil {
				return nil, err
			}
			if resp.StatusCode == http.StatusOK {
				return resp, nil
			}
			resp.Body.Close()
			serr := &statusError{resp.StatusCode}
			if resp.StatusCode == http.StatusTooManyRequests {
				if s, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 32); err == nil && s > 0 {
					return nil, &retryAfterError{serr, time.Duration(s) * time.Second}
				}
			}
			if !serr.retryable() {
				return nil, retrygo.Unrecoverable(serr)
			}
			return nil, serr
		},
			retrygo.Attempts(retries+1),
			retrygo.Delay(firstWait),
			retrygo.DelayType(delay),
			retrygo.Context(ctx),
			retrygo.LastErrorOnly(true),
		)
		if err != nil {
			return -1, err
		}
		return readAnswer(resp)
	})
}

// buildGoRetry follows go-retry's README: DoValue with an exponential
// backoff from 1 s (1, 2, 4, 8 s) under WithMaxRetries(4), marking the
// errors to retry with RetryableError. go-retry has no way to take a
// server's retry-after into a wait, so it does not. Its time knob is
// WithMaxDuration, which starts its clock when built: the backoff is
// built per call, with 60 s for the primary under a deadline. The HTTP
// client's 30 s Timeout bounds each attempt and a plain loop falls back.
func buildGoRetry(e *Env) doFunc {
	clients := [2]*http.Client{e.client(0, attemptTimeout), e.client(1, attemptTimeout)}
	return failOver(func(ctx context.Context, b, id int) (int, error) {
		bo := goretry.WithMaxRetries(retries, goretry.NewExponential(firstWait))
		if b == 0 && e.deadline {
			bo = goretry.WithMaxDuration(primaryBudget, bo)
		}
		resp, err := goretry.DoValue(ctx, bo, func(ctx context.Context) (*http.Response, error) {
			resp, err := e.send(ctx, clients[b], b, id)
			if err != nil {
				return nil, goretry.RetryableError(err)
			}
			if resp.StatusCode == http.StatusOK {
				return resp, nil
			}
			resp.Body.Close()
			serr := &statusError{resp.StatusCode}
			if serr.retryable() {
				return nil, goretry.RetryableError(serr)
			}
			return nil, serr
		})
		if err != nil {
			return -1, err
		}
		return readAnswer(resp)
	})
}

// buildOpenAI is the OpenAI Go SDK itself, with its own default retry
// loop (two retries; waits of 0.5 s doubling, less up to a quarter of
// random jitter; Retry-After and Retry-After-Ms honoured up to 2 minutes,
// a longer hint ending the retries; x-should-retry obeyed), over the
// scripted providers as its HTTP transport. Its per-attempt knob,
// WithRequestTimeout, is set to 30 s; its time knob for the whole call is
// the context, so under a deadline the primary's ends after 60 s. The SDK
// has no fallback: a plain loop over one client per provider.
//
// The SDK draws its jitter from math/rand's global source. The run seeds
// it, which takes GODEBUG=randseednop=0 (set by the package's tests with
// a //go:debug line), so that the same seed gives the same waits.
func buildOpenAI(e *Env) doFunc {
	var clients [2]openai.Client
	for b := range clients {
		clients[b] = openai.NewClient(
			option.WithBaseURL(e.urls[b]),
			option.WithAPIKey("sk-outage-simulation"),
			option.WithHTTPClient(&http.Client{Transport: e.transports[b]}),
			option.WithRequestTimeout(attemptTimeout),
		)
	}
	//lint:ignore SA1019 the SDK's jitter comes from the global source; seeding it is the only way to repeat a run
	mathrand.Seed(int64(e.seed))
	return failOver(func(ctx context.Context, b, id int) (int, error) {
		ctx, cancel := e.primaryContext(ctx, b)
		defer cancel()
		comp, err := clients[b].Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "sim",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("question")},
		}, option.WithHeader(idHeader, strconv.Itoa(id)))
		if err != nil {
			return -1, err
		}
		if len(comp.Choices) == 0 || comp.Choices[0].FinishReason == "length" {
			return -1, errTruncated
		}
		return providerIndex(comp.Model), nil
	})
}
