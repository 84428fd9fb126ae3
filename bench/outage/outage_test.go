//go:debug randseednop=0

package outage

import (
	"os"
	"testing"
	"testing/synctest"
)

const testSeed = 1

func TestQuick(t *testing.T) {
	scs := Scenarios()
	for i := range scs {
		sc := &scs[i]
		var rs []*Result
		for _, st := range Strategies() {
			synctest.Test(t, func(t *testing.T) {
				rs = append(rs, play(sc, st, testSeed))
			})
		}
		WriteMarkdown(os.Stdout, i+1, sc, rs)
	}
}
