package outage

import (
	"net/http"
	"time"
)

// Pool scenarios serve one model from several deployments, each behind
// token buckets of its own, of requests and of the model's tokens, that
// send OpenAI's rate-limit headers for both. Every request costs tokens
// (poolTokens) and asks for a completion budget larger than what it
// uses, so an estimate made before it is sent (its input and its budget)
// overstates it until its answer reports its usage.

// poolTokens is what a request of the pool scenarios costs: 100 to 500
// input tokens and 50 to 250 output tokens, drawn per request, with a
// completion budget of 300.
var poolTokens = Tokens{In: [2]int{100, 500}, Out: [2]int{50, 250}, MaxTokens: 300}

// poolDeadline is each caller's deadline in the pool scenarios.
const poolDeadline = 60 * time.Second

// key is one deployment of the pool scenarios: a key (or region) of rate
// requests a second and tokens a second, with buckets of ten seconds of
// each, answering in answer.
func key(name string, rate, tokens float64, answer time.Duration, tier int) Provider {
	return Provider{Name: name, Answer: answer, Rate: rate, Burst: int(10 * rate),
		TokenRate: tokens, TokenBurst: int(10 * tokens), Tier: tier}
}

// meanCost is the mean tokens a request of t costs.
func (t Tokens) meanCost() float64 {
	return float64(t.In[0]+t.In[1]+t.Out[0]+t.Out[1]) / 2
}

// capacity is what provider p can answer, in requests a second, of
// requests costing cost tokens each: the lower of its two buckets' rates.
func (p *Provider) capacity(cost float64) float64 {
	c := p.Rate
	if p.TokenRate > 0 && (c == 0 || p.TokenRate/cost < c) {
		c = p.TokenRate / cost
	}
	return c
}

// capacity is what the deployments can answer together over the
// scenario's arrivals, in requests: the sum of their rates, bursts left
// out.
func (sc *Scenario) capacity() float64 {
	sum := 0.0
	for _, p := range sc.providers() {
		sum += p.capacity(sc.Tokens.meanCost())
	}
	return sum * sc.span().Seconds()
}

// atLoad is n requests over the deployments' summed capacity at share of
// it, over five minutes.
func atLoad(share float64, deps ...Provider) int {
	sum := 0.0
	for i := range deps {
		sum += deps[i].capacity(poolTokens.meanCost())
	}
	return int(share*sum*fiveMinutes.Seconds() + 0.5)
}

// The deployments of the pool scenarios: two keys of one model, each of
// 1 request and 400 tokens a second (60 requests and 24,000 tokens a
// minute, the tokens binding at 0.89 requests a second); three regions
// of the same; a provisioned deployment of the same and a pay-as-you-go
// one of twice that, slower.
var (
	twoKeys = []Provider{
		key("key-a", 1, 400, primaryAnswer, 0),
		key("key-b", 1, 400, primaryAnswer, 0),
	}
	threeRegions = []Provider{
		key("us", 1, 400, primaryAnswer, 0),
		key("eu", 1, 400, primaryAnswer, 0),
		key("asia", 1, 400, primaryAnswer, 0),
	}
	provisioned = key("provisioned", 1, 400, primaryAnswer, 0)
	payAsYouGo  = key("paygo", 2, 800, secondaryAnswer, 1)
)

// PoolScenarios returns the pool scenarios, in order: two keys at 95% of
// their summed capacity; three regions at half of theirs, healthy and
// with the first hard down (503) for two minutes; and a provisioned
// deployment with a pay-as-you-go one to spill over to, its load below
// the provisioned capacity for two and a half minutes and above it for
// the rest.
func PoolScenarios() []Scenario {
	down := append([]Provider(nil), threeRegions...)
	down[0].Phases = []Phase{
		{Until: time.Minute, Status: http.StatusOK},
		{Until: 3 * time.Minute, Status: http.StatusServiceUnavailable},
	}
	half := 2*time.Minute + 30*time.Second
	provCap := provisioned.capacity(poolTokens.meanCost())
	return []Scenario{{
		Name:     "two-keys",
		About:    "two keys of one model, each behind buckets of 1 request/s and 400 tokens/s (10 s of each: burst 10 requests, 4,000 tokens), answering in 2 s; requests of 100–500 input and 50–250 output tokens, a budget of 300; load at 95% of the summed capacity over 5 min; 60 s deadline",
		Requests: atLoad(0.95, twoKeys...), Over: fiveMinutes, Deadline: poolDeadline,
		Deployments: twoKeys, Tokens: poolTokens,
	}, {
		Name:     "three-regions",
		About:    "three regions of one model, each as a key of two-keys; load at 50% of the summed capacity over 5 min; 60 s deadline",
		Requests: atLoad(0.5, threeRegions...), Over: fiveMinutes, Deadline: poolDeadline,
		Deployments: threeRegions, Tokens: poolTokens,
	}, {
		Name:     "region-down",
		About:    "three-regions with the first region (us) hard down, 503 in 0.5 s, for [1m, 3m)",
		Requests: atLoad(0.5, threeRegions...), Over: fiveMinutes, Deadline: poolDeadline,
		Deployments: down, Tokens: poolTokens,
	}, {
		Name:  "spillover",
		About: "a provisioned deployment (tier 0) as a key of two-keys, and pay-as-you-go (tier 1) of 2 requests/s and 800 tokens/s answering in 3 s; load at 70% of the provisioned capacity for 2m30s, then at 150% of it for 2m30s; 60 s deadline",
		Waves: []Wave{
			{Until: half, Requests: int(0.7*provCap*half.Seconds() + 0.5)},
			{Until: fiveMinutes, Requests: int(1.5*provCap*half.Seconds() + 0.5)},
		},
		Deadline:    poolDeadline,
		Deployments: []Provider{provisioned, payAsYouGo}, Tokens: poolTokens,
	}}
}
