package outage

import (
	"net/http"
	"time"
)

// The figures: answers take 2 s from the primary and 3 s from the
// secondary, callers have 90 s unless a scenario says otherwise.
const (
	primaryAnswer   = 2 * time.Second
	secondaryAnswer = 3 * time.Second
	deadline        = 90 * time.Second
	fiveMinutes     = 5 * time.Minute

	// fastAnswer is the primary's answer in fast-answers-slow-bucket:
	// well inside the second its bucket takes to refill one request.
	fastAnswer = 300 * time.Millisecond
)

// healthySecondary is the fallback every scenario has unless it says
// otherwise; truncating is the one of scenarios 1, 2, 7 and 8, which
// cuts 10% of requests off at their completion budget.
var (
	healthySecondary    = Provider{Name: "Secondary", Answer: secondaryAnswer}
	truncatingSecondary = Provider{Name: "Secondary", Answer: secondaryAnswer, Truncate: 0.10}
)

// outageRecovery is scenario 1, and with no deadline scenario 7.
func outageRecovery(name string, dl time.Duration) Scenario {
	return Scenario{
		Name:     name,
		Requests: 200, Over: fiveMinutes, Deadline: dl,
		Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: []Phase{
			{Until: 2 * time.Minute, Status: http.StatusServiceUnavailable},
			{Until: 2*time.Minute + 30*time.Second, Status: http.StatusTooManyRequests, RetryAfter: 20 * time.Second},
		}},
		Second: truncatingSecondary,
	}
}

// hardDown is scenario 2, and with no deadline scenario 8: a request the
// secondary truncates cannot be answered by anyone, so how soon each
// strategy gives up on it is what the two tell apart.
func hardDown(name string, dl time.Duration) Scenario {
	return Scenario{
		Name:     name,
		Requests: 200, Over: fiveMinutes, Deadline: dl,
		Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: []Phase{
			{Until: 1000 * time.Hour, Status: http.StatusServiceUnavailable},
		}},
		Second: truncatingSecondary,
	}
}

// Scenarios returns the nine scenarios of the benchmark, in order.
// Details a scenario leaves open are chosen here: every scenario
// has a secondary, healthy (3 s answers, no truncation) unless the
// scenario says otherwise; a scenario that names no request count has
// 200 requests over 5 minutes; a 503 carries no Retry-After.
func Scenarios() []Scenario {
	outage := outageRecovery("outage-recovery", deadline)
	outage.About = "primary 503 for [0, 2m), then 429 with Retry-After 20 s until 2m30s, then healthy; secondary healthy, 10% of requests truncated there; 200 requests over 5 min; 90 s deadline"
	batch := outageRecovery("batch-outage", 0)
	batch.About = "outage-recovery with no deadline"
	hard := hardDown("hard-down", deadline)
	hard.About = "primary 503 throughout; secondary healthy, 10% of requests truncated there; 200 requests over 5 min; 90 s deadline"
	hardBatch := hardDown("hard-down-no-deadline", 0)
	hardBatch.About = "hard-down with no deadline"
	return []Scenario{
		outage,
		hard,
		{
			Name:     "hang",
			About:    "a request sent to the primary before 2 min answers after 120 s, then healthy; secondary healthy; 200 requests over 5 min; 90 s deadline",
			Requests: 200, Over: fiveMinutes, Deadline: deadline,
			Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: []Phase{
				{Until: 2 * time.Minute, Hang: 120 * time.Second},
			}},
			Second: healthySecondary,
		},
		{
			Name:     "rate-limit",
			About:    "primary healthy behind a token bucket of 1 request/s, burst 10 (429 with Retry-After = time to the next token); secondary healthy; 600 requests over 5 min; 90 s deadline",
			Requests: 600, Over: fiveMinutes, Deadline: deadline,
			Primary: Provider{Name: "Primary", Answer: primaryAnswer, Rate: 1, Burst: 10},
			Second:  healthySecondary,
		},
		{
			Name:     "long-retry-after",
			About:    "primary 429 with Retry-After 45 s until 2 min, then healthy; secondary healthy; 200 requests over 5 min; 90 s deadline",
			Requests: 200, Over: fiveMinutes, Deadline: deadline,
			Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: []Phase{
				{Until: 2 * time.Minute, Status: http.StatusTooManyRequests, RetryAfter: 45 * time.Second},
			}},
			Second: healthySecondary,
		},
		{
			Name:     "failover-overload",
			About:    "primary 503 for [0, 3m), then healthy; secondary behind a token bucket of 0.5 request/s, burst 5; 200 requests over 5 min; 90 s deadline",
			Requests: 200, Over: fiveMinutes, Deadline: deadline,
			Primary: Provider{Name: "Primary", Answer: primaryAnswer, Phases: []Phase{
				{Until: 3 * time.Minute, Status: http.StatusServiceUnavailable},
			}},
			Second: Provider{Name: "Secondary", Answer: secondaryAnswer, Rate: 0.5, Burst: 5},
		},
		batch,
		hardBatch,
		{
			// The primary's answer comes back long before its bucket has
			// the next request: most of the time nothing is in flight, so
			// a rule that let one through whenever nothing was in flight
			// would send into an empty bucket; only the reset says when
			// the next request is admitted.
			Name:     "fast-answers-slow-bucket",
			About:    "primary healthy, answers in 0.3 s, behind a token bucket of 1 request/s, burst 2 (429 with Retry-After = time to the next token); secondary healthy; 600 requests over 5 min; 90 s deadline",
			Requests: 600, Over: fiveMinutes, Deadline: deadline,
			Primary: Provider{Name: "Primary", Answer: fastAnswer, Rate: 1, Burst: 2},
			Second:  healthySecondary,
		},
	}
}
