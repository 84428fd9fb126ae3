package outage

import (
	"bytes"
	"os"
	"testing"
)

// playFleets plays every fleet scenario with fleets of every size, each
// run in a bubble of its own; results[i][k] are scenario i's rows for
// FleetSizes[k].
func playFleets(t *testing.T, seed uint64) [][][]*Result {
	t.Helper()
	scenarios := FleetScenarios()
	all := make([][][]*Result, len(scenarios))
	for i := range scenarios {
		for _, n := range FleetSizes {
			var rows []*Result
			for _, st := range FleetStrategies(n) {
				rows = append(rows, playOne(t, &scenarios[i], st, seed))
			}
			all[i] = append(all[i], rows)
		}
	}
	return all
}

func TestFleetPrint(t *testing.T) {
	scenarios := FleetScenarios()
	res := playFleets(t, testSeed)
	var b bytes.Buffer
	for i := range scenarios {
		WriteFleetMarkdown(&b, &scenarios[i], FleetSizes, res[i])
	}
	os.Stdout.Write(b.Bytes())
}
