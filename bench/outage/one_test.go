package outage

import (
	"os"
	"testing"
	"time"
)

func TestOneFleetRow(t *testing.T) {
	name := os.Getenv("ONE_ROW")
	if name == "" {
		t.Skip()
	}
	for _, sc := range FleetScenarios() {
		if sc.Name != name {
			continue
		}
		r := playIn(t, &sc, SharedFleet(16, StoreSetup{Latency: 2 * time.Millisecond}, false), testSeed, 0)
		t.Logf("%s: sent %d answered %d 429 %d p95 %v storecalls %d", sc.Name, r.Sent, r.Answered, r.Got429, r.P95, r.StoreCalls)
	}
}
