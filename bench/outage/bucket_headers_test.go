package outage

import (
	"maps"
	"net/http"
	"testing"
	"time"
)

// TestBucketHeaders checks the rate-limit headers a bucket sends with the
// last of a run of requests: the bucket's size, the whole requests left
// after that instant's requests, and the time until it is full again,
// rounded up to the millisecond and formatted as OpenAI does.
func TestBucketHeaders(t *testing.T) {
	tests := []struct {
		name        string
		rate        float64
		burst       int
		sends       []time.Duration // when each request arrives, in order
		wantStatus  int
		wantHeaders map[string]string
	}{{
		name: "first", rate: 1, burst: 10,
		sends:      []time.Duration{0},
		wantStatus: http.StatusOK,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "10", "X-Ratelimit-Remaining-Requests": "9", "X-Ratelimit-Reset-Requests": "1s",
		},
	}, {
		name: "refilled_part_way", rate: 1, burst: 10,
		sends:      []time.Duration{0, 300 * time.Millisecond},
		wantStatus: http.StatusOK,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "10", "X-Ratelimit-Remaining-Requests": "8", "X-Ratelimit-Reset-Requests": "1.7s",
		},
	}, {
		name: "rounded_up", rate: 3, burst: 2,
		sends:      []time.Duration{0},
		wantStatus: http.StatusOK,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "2", "X-Ratelimit-Remaining-Requests": "1", "X-Ratelimit-Reset-Requests": "334ms",
		},
	}, {
		name: "minutes", rate: 1.0 / 60, burst: 6,
		sends:      []time.Duration{0, 0, 0, 0, 0, 0},
		wantStatus: http.StatusOK,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "6", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "6m0s",
		},
	}, {
		// The 429 carries the headers too, and its Retry-After.
		name: "refused", rate: 1, burst: 2,
		sends:      []time.Duration{0, 0, 400 * time.Millisecond},
		wantStatus: http.StatusTooManyRequests,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "2", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "1.6s",
			"Retry-After": "1",
		},
	}, {
		// A bucket of one, refilled between requests.
		name: "bucket_of_one", rate: 2, burst: 1,
		sends:      []time.Duration{0, time.Second, 3 * time.Second},
		wantStatus: http.StatusOK,
		wantHeaders: map[string]string{
			"X-Ratelimit-Limit-Requests": "1", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "500ms",
		},
	}}
	names := []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests", "Retry-After"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &provider{Provider: &Provider{Name: "Primary", Answer: primaryAnswer, Rate: tc.rate, Burst: tc.burst}, tokens: float64(tc.burst)}
			var o outcome
			for _, at := range tc.sends {
				o = p.admit(&caller{}, at)
			}
			resp := p.response(nil, o)
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("response().StatusCode = %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			got := map[string]string{}
			for _, n := range names {
				if v := resp.Header.Get(n); v != "" {
					got[n] = v
				}
			}
			// The bench module does not depend on go-cmp; flat string maps
			// need no more than maps.Equal.
			if !maps.Equal(got, tc.wantHeaders) {
				t.Errorf("response() headers = %v, want %v", got, tc.wantHeaders)
			}
		})
	}
}

// TestBucketHeadersShareTheInstant checks that the requests a bucket
// decides at one instant are told the same: what is left after all of
// them, whichever reached it first.
func TestBucketHeadersShareTheInstant(t *testing.T) {
	p := &provider{Provider: &Provider{Name: "Primary", Answer: primaryAnswer, Rate: 1, Burst: 10}, tokens: 10}
	first := p.admit(&caller{}, 0)
	p.admit(&caller{}, 0)
	p.admit(&caller{}, 0)
	later := p.admit(&caller{}, time.Second)
	if got := p.response(nil, first).Header.Get("X-Ratelimit-Remaining-Requests"); got != "7" {
		t.Errorf("first of three at one instant: remaining = %q, want %q", got, "7")
	}
	if got := p.response(nil, later).Header.Get("X-Ratelimit-Remaining-Requests"); got != "7" {
		t.Errorf("one a second later: remaining = %q, want %q", got, "7")
	}
	if got := p.response(nil, first).Header.Get("X-Ratelimit-Reset-Requests"); got != "3s" {
		t.Errorf("first of three at one instant: reset = %q, want %q", got, "3s")
	}
}
