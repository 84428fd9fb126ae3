package llmretry

import (
	"testing"
	"time"
)

// choose is a pure function of the deployments' standings: the rules of
// the pool's choice as a table, without a clock or a Breaker.
func TestChoose(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 4, 30, 0, 0, time.UTC)
	open := func(headroom float64, inFlight int64) standing {
		return standing{open: true, headroom: headroom, inFlight: inFlight}
	}
	held := func(ready time.Duration, ahead int64) standing {
		return standing{ready: t0.Add(ready), ahead: ahead}
	}
	dep := func(tier, weight int) Deployment[string, string] {
		return Deployment[string, string]{Tier: tier, Weight: weight}
	}
	tests := []struct {
		name  string
		pool  []Deployment[string, string]
		st    []standing
		tried []bool
		want  choice
	}{
		{"only", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{held(time.Second, 0), open(1, 0)}, nil, choice{1, ChosenOnly}},
		{"headroom", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{open(0.2, 0), open(0.5, 3)}, nil, choice{1, ChosenHeadroom}},
		{"in_flight_for_weight", []Deployment[string, string]{dep(0, 3), dep(0, 1)}, []standing{open(1, 2), open(1, 1)}, nil, choice{0, ChosenInFlight}},
		{"order", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{open(1, 1), open(1, 1)}, nil, choice{0, ChosenOrder}},
		{"tier", []Deployment[string, string]{dep(1, 0), dep(0, 0)}, []standing{open(1, 0), open(0.1, 5)}, nil, choice{1, ChosenTier}},
		{"spill", []Deployment[string, string]{dep(0, 0), dep(1, 0)}, []standing{held(time.Second, 0), open(1, 0)}, nil, choice{1, ChosenSpill}},
		{"tried_left_out", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{open(1, 0), open(0.1, 0)}, []bool{true, false}, choice{1, ChosenOnly}},
		{"soonest_ready", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{held(3*time.Second, 0), held(2*time.Second, 1)}, nil, choice{1, ChosenSoonest}},
		{"soonest_fewer_ahead_for_weight", []Deployment[string, string]{dep(0, 1), dep(0, 3)}, []standing{held(time.Second, 1), held(time.Second, 2)}, nil, choice{1, ChosenSoonest}},
		{"soonest_order", []Deployment[string, string]{dep(0, 0), dep(0, 0)}, []standing{held(time.Second, 1), held(time.Second, 1)}, nil, choice{0, ChosenSoonest}},
		{"soonest_of_any_tier", []Deployment[string, string]{dep(0, 0), dep(1, 0)}, []standing{held(2*time.Second, 0), held(time.Second, 0)}, nil, choice{1, ChosenSoonest}},
		{"all_tried", []Deployment[string, string]{dep(0, 0)}, []standing{open(1, 0)}, []bool{true}, choice{-1, ChosenSoonest}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tried := tc.tried
			if tried == nil {
				tried = make([]bool, len(tc.pool))
			}
			if got := choose(tc.pool, tc.st, tried); got != tc.want {
				t.Errorf("choose() = %+v, want %+v", got, tc.want)
			}
		})
	}
}
