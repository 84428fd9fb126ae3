package outage

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPacedChecksCanFail breaks the paced row's set-up on purpose and
// checks that the paced invariants, and invariants' early sends, catch
// it; the same scenario played with the row as published passes them.
func TestPacedChecksCanFail(t *testing.T) {
	tests := []struct {
		name     string
		scenario string
		drop     []string // response headers the broken row's transports lose
		want     string
	}{{
		// Without the rate-limit headers the Breaker has nothing to pace
		// by, and learns of the bucket from its 429s again.
		name:     "limits_ignored",
		scenario: "rate-limit",
		drop:     []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		want:     "requests answered 429, want 0",
	}, {
		name:     "limits_ignored_failover",
		scenario: "failover-overload",
		drop:     []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		want:     "requests answered 429, want 0",
	}, {
		// Without the retry-after, the 45 s hint is lost and the chain
		// retries into it.
		name:     "retry_after_ignored",
		scenario: "long-retry-after",
		drop:     []string{"Retry-After"},
		want:     "early sends",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := scenarioNamed(t, tc.scenario)
			broken := Strategy{Name: namePaced, Breaker: true, Paced: true, build: func(e *Env) doFunc {
				for i := range e.transports {
					e.transports[i] = dropNamed{e.transports[i], tc.drop}
				}
				return buildLLMRetryPaced(e)
			}}
			results := []*Result{playOne(t, sc, broken, testSeed)}
			got := strings.Join(append(invariants(results), pacedInvariants(sc, results)...), "\n")
			if !strings.Contains(got, tc.want) {
				t.Errorf("invariants() = %q, want a line with %q", got, tc.want)
			}
			results[0] = playOne(t, sc, Strategy{Name: namePaced, Breaker: true, Paced: true, build: buildLLMRetryPaced}, testSeed)
			got = strings.Join(append(invariants(results), pacedInvariants(sc, results)...), "\n")
			if strings.Contains(got, tc.want) {
				t.Errorf("unbroken: invariants() = %q, want no line with %q", got, tc.want)
			}
		})
	}
}

// TestPacedInvariantsRows checks the paced rules on hand-made rows: a 429
// counts against the paced row only where buckets alone send them, and
// the paced row may answer no fewer than any row, peer or not.
func TestPacedInvariantsRows(t *testing.T) {
	bucketOnly := &Scenario{Name: "bucket", Primary: Provider{Rate: 1, Burst: 10}}
	scripted := &Scenario{Name: "scripted", Primary: Provider{Rate: 1, Burst: 10, Phases: []Phase{
		{Until: time.Minute, Status: http.StatusTooManyRequests, RetryAfter: 20 * time.Second},
	}}}
	row := func(name string, peer, paced bool, answered, got429 int) *Result {
		return &Result{Strategy: name, Peer: peer, Breaker: paced, Paced: paced, Requests: 10, Answered: answered, Got429: got429}
	}
	tests := []struct {
		name    string
		sc      *Scenario
		results []*Result
		want    []string
	}{{
		name:    "429_from_bucket",
		sc:      bucketOnly,
		results: []*Result{row(namePaced, false, true, 10, 1)},
		want:    []string{"llmretry + Breaker, paced: 1 requests answered 429, want 0: every 429 here comes from a bucket that said what it held"},
	}, {
		name:    "429_from_script",
		sc:      scripted,
		results: []*Result{row(namePaced, false, true, 10, 3)},
	}, {
		name:    "429_unpaced_row",
		sc:      bucketOnly,
		results: []*Result{row(nameBreaker, false, false, 10, 5), row(namePaced, false, true, 10, 0)},
	}, {
		name:    "fewer_than_breaker",
		sc:      scripted,
		results: []*Result{row(nameBreaker, false, false, 10, 0), row(namePaced, false, true, 9, 0)},
		want:    []string{"llmretry + Breaker, paced: answered 9, fewer than llmretry + Breaker's 10"},
	}, {
		name:    "fewer_than_peer",
		sc:      scripted,
		results: []*Result{row(namePaced, false, true, 8, 0), row(nameOpenAI, true, false, 9, 0)},
		want:    []string{"llmretry + Breaker, paced: answered 8, fewer than openai-go (default retries)'s 9"},
	}, {
		name:    "as_many",
		sc:      scripted,
		results: []*Result{row(nameBreaker, false, false, 9, 0), row(namePaced, false, true, 9, 0), row(nameOpenAI, true, false, 9, 0)},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := pacedInvariants(tc.sc, tc.results)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("pacedInvariants() = %q, want %q", got, tc.want)
			}
		})
	}
}

// scenarioNamed returns the benchmark's scenario called name.
func scenarioNamed(t *testing.T, name string) *Scenario {
	t.Helper()
	scenarios := Scenarios()
	for i := range scenarios {
		if scenarios[i].Name == name {
			return &scenarios[i]
		}
	}
	t.Fatalf("no scenario %q", name)
	return nil
}

// dropNamed is a transport that loses the named response headers.
type dropNamed struct {
	next  http.RoundTripper
	names []string
}

func (d dropNamed) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)
	if resp != nil {
		for _, n := range d.names {
			resp.Header.Del(n)
		}
	}
	return resp, err
}
