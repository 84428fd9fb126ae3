package outage

import (
	"fmt"

	"testing"
	"time"
)

func TestDbgReplay(t *testing.T) {
	var sc Scenario
	for _, s := range FleetScenarios() {
		if s.Name == "failover-overload" {
			sc = s
		}
	}
	st := SharedFleet(4, StoreSetup{Latency: 20 * time.Millisecond, Timeout: 250 * time.Millisecond}, true)
	var worlds []*world
	for range 4 {
		playIn(t, &sc, st, testSeed, 0)
		worlds = append(worlds, lastWorld)
	}
	for k := 1; k < len(worlds); k++ {
		a, b := worlds[0], worlds[k]
		n := 0
		for i := range a.calls {
			ca, cb := a.calls[i], b.calls[i]
			if ca.done != cb.done || len(ca.flights) != len(cb.flights) {
				n++
				if n <= 3 {
					fmt.Printf("replay %d caller %d arrive %v: done %v vs %v, flights %v vs %v\n", k, i, ca.arrive, ca.done-ca.arrive, cb.done-cb.arrive, ca.flights, cb.flights)
				}
			}
		}
		fmt.Printf("replay %d: %d callers differ\n", k, n)
	}
}
