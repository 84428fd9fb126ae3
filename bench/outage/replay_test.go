package outage

import (
	"bytes"
	"fmt"
	"testing"
)

// replays is how many times TestReplayIsDeterministic plays the test seed.
const replays = 5

// TestReplayIsDeterministic plays every scenario with the test seed five
// times and compares the reports byte for byte, every row included, and
// the time series behind the pictures. The first play is the published
// one, in caller order; each replay runs what is due at one instant in
// another seeded order, as goroutine scheduling would without the
// dispatcher. Calls waiting for the same breaker wake at the same instant
// when it changes state: which of them goes first must be the Breaker's
// decision, by its line, not the scheduler's.
func TestReplayIsDeterministic(t *testing.T) {
	if testing.Short() {
		t.Skip("plays every scenario four more times")
	}
	scenarios := Scenarios()
	first := publishedResults(t)
	var want bytes.Buffer
	if err := Report(&want, testSeed, scenarios, first, nil); err != nil {
		t.Fatal(err)
	}
	for n := 2; n <= replays; n++ {
		order := uint64(n - 1)
		again := playAll(t, testSeed, order, scenarios, Strategies())
		var got bytes.Buffer
		if err := Report(&got, testSeed, scenarios, again, nil); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want.Bytes(), got.Bytes()) {
			t.Errorf("play %d of seed %d (dispatcher order %d) differs from the first:\n%s", n, testSeed, order, lineDiff(want.String(), got.String()))
		}
		for i := range scenarios {
			for j, r := range again[i] {
				w := first[i][j]
				if fmt.Sprint(r.SentBins, r.AnsBins) != fmt.Sprint(w.SentBins, w.AnsBins) {
					t.Errorf("%s: %s: play %d's time series differ from the first's", scenarios[i].Name, r.Strategy, n)
				}
			}
		}
	}
}
