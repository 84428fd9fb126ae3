package llmretry

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The plan is a pure value: these tests play a call's way through its
// backends without a clock or a breaker. Each step says how the call left
// the backend at the plan's position; the test checks which backends the
// plan visits, and what last said at each.
func TestPlan(t *testing.T) {
	skip := left{why: WhyBreaker, kind: KindTransient, skipped: true}
	truncated := left{why: WhyNotRetryable, kind: KindTruncated}
	rejected := left{why: WhyNotRetryable, kind: KindRejected}
	down := left{why: WhyWaitsUsed, kind: KindTransient}
	putOff := left{why: WhyBreaker, kind: KindTransient} // a retry put off for the breaker
	putOffParse := left{why: WhyBreaker, kind: KindParse}
	tests := []struct {
		name  string
		n     int
		steps []left // how the call leaves each backend it visits, in turn
		want  []int  // the backends visited
		last  []bool // last(kind of that step) at each visit
	}{
		{
			name:  "in_order",
			n:     3,
			steps: []left{down, rejected, truncated},
			want:  []int{0, 1, 2},
			last:  []bool{false, false, true},
		},
		{
			// The secondary truncates: come back to the skipped primary,
			// which is then the last.
			name:  "come_back",
			n:     2,
			steps: []left{skip, truncated, skip},
			want:  []int{0, 1, 0},
			last:  []bool{false, false, true},
		},
		{
			// The secondary is down too: the outage is wider, no
			// come-back.
			name:  "no_come_back_after_health",
			n:     2,
			steps: []left{skip, down},
			want:  []int{0, 1},
			last:  []bool{false, true},
		},
		{
			// A health failure rules out the backends skipped before it,
			// not those after.
			name:  "skipped_after_health_failure",
			n:     4,
			steps: []left{skip, down, skip, rejected, skip},
			want:  []int{0, 1, 2, 3, 2},
			last:  []bool{false, false, false, false, true},
		},
		{
			// A retry put off for the breaker failed for the backend's
			// health: come back to it, but not to those skipped before.
			name:  "put_off",
			n:     3,
			steps: []left{skip, putOff, rejected, down},
			want:  []int{0, 1, 2, 1},
			last:  []bool{false, false, false, true},
		},
		{
			// One put off after a failure about the request keeps the
			// earlier skips.
			name:  "put_off_parse",
			n:     3,
			steps: []left{skip, putOffParse, rejected, skip, down},
			want:  []int{0, 1, 2, 0, 1},
			last:  []bool{false, false, false, false, true},
		},
		{
			// The second pass happens once: skipped again, the backends
			// are not come back to a third time.
			name:  "once",
			n:     3,
			steps: []left{skip, skip, truncated, skip, truncated},
			want:  []int{0, 1, 2, 0, 1},
			last:  []bool{false, false, false, false, true},
		},
		{
			// A skip of the last backend is the end of the plan: a skip
			// is about the backend's health.
			name:  "last_skipped",
			n:     2,
			steps: []left{rejected, skip},
			want:  []int{0, 1},
			last:  []bool{false, true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlan(tc.n)
			var got []int
			var last []bool
			for _, l := range tc.steps {
				if p.done() {
					t.Fatalf("plan done after %v, want %d more steps", got, len(tc.steps)-len(got))
				}
				bi := p.backend()
				got = append(got, bi)
				last = append(last, p.last(l.kind))
				p = p.next(bi, l)
			}
			if !p.done() {
				t.Errorf("plan not done after %v: backend %d is next", got, p.backend())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("backends visited (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.last, last); diff != "" {
				t.Errorf("last() at each visit (-want +got):\n%s", diff)
			}
		})
	}
}

// next returns a new plan and leaves the one it was called on as it was.
func TestPlanNextIsPure(t *testing.T) {
	p := newPlan(3)
	p = p.next(0, left{why: WhyBreaker, kind: KindTransient, skipped: true})
	before := p
	q := p.next(1, left{why: WhyBreaker, kind: KindTransient, skipped: true})
	_ = p.next(1, left{why: WhyNotRetryable, kind: KindRejected})
	if diff := cmp.Diff(before, p, cmp.AllowUnexported(plan{})); diff != "" {
		t.Errorf("plan after next (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 1}, q.deferred); diff != "" {
		t.Errorf("deferred (-want +got):\n%s", diff)
	}
}

// sentTo counts the requests sent, not the skips.
func TestSentTo(t *testing.T) {
	attempts := []Attempt{{Backend: 0}, {Backend: 1, Skipped: true}, {Backend: 0, Skipped: true}, {Backend: 0}, {Backend: 1}}
	for bi, want := range []int{2, 1, 0} {
		if got := sentTo(attempts, bi); got != want {
			t.Errorf("sentTo(attempts, %d) = %d, want %d", bi, got, want)
		}
	}
}
