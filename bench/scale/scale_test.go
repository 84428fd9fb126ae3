package scale

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

var (
	sizes = flag.String("sizes", "250,1250", "comma-separated call counts")
	loads = flag.String("loads", "inflight,closing,paced,store", "comma-separated loads")
)

func TestScale(t *testing.T) {
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(*loads, ",") {
			switch l {
			case "inflight":
				fmt.Println(InFlight(t, n, false))
				fmt.Println(InFlight(t, n, true))
			case "closing":
				fmt.Println(DrainClosing(t, n))
			case "paced":
				fmt.Println(DrainPaced(t, n))
			case "store":
				fmt.Println(StoreWaiting(t, n))
			}
		}
	}
}
