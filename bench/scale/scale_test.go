package scale

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var (
	sizes  = flag.String("sizes", "250,1250", "comma-separated call counts, for TestScale")
	loads  = flag.String("loads", "inflight,closing,paced,store", "comma-separated loads, for TestScale")
	update = flag.Bool("update", false, "write results/scale.md, its picture and the scaling section of BENCHMARKS.md")
)

// TestScale prints the figures of the loads and sizes its flags name, for
// a look at one of them.
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
				fmt.Println(StoreClosing(t, n))
			}
		}
	}
}

// Every load answers every call, and the paced drain draws no 429: the
// figures are of work done right.
func TestLoadsAnswerEveryCall(t *testing.T) {
	for _, r := range []Result{InFlight(t, 250, true), DrainClosing(t, 250), DrainPaced(t, 250), StoreWaiting(t, 100), StoreClosing(t, 100)} {
		if r.Answered != r.Calls || r.Refused != 0 {
			t.Errorf("%s: %d of %d answered, %d refused; want all, none", r.Load, r.Answered, r.Calls, r.Refused)
		}
	}
}

// The markers in BENCHMARKS.md between which TestWriteScaleReport writes.
const (
	scaleBegin = "<!-- begin scaling report: written by `cd bench && go test ./scale -run TestWriteScaleReport -update`; do not edit by hand -->\n"
	scaleEnd   = "<!-- end scaling report -->\n"
)

// TestWriteScaleReport measures every load and writes the report, when
// run with -update.
func TestWriteScaleReport(t *testing.T) {
	if !*update {
		t.Skip("run with -update to measure and write the report")
	}
	r := Measure(t)
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := r.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("results", "scale.svg"), svg.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("results", "scale.md"), md.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Stdout.Write(md.Bytes())
	section := md.String() + "\n![CPU against calls in flight or waiting](bench/scale/results/scale.svg)\n\n"
	if err := splice("../../BENCHMARKS.md", scaleBegin, scaleEnd, section); err != nil {
		t.Fatal(err)
	}
}

// splice replaces what lies between the markers in the file at path.
func splice(path, begin, end, text string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(old), begin)
	if !ok {
		return fmt.Errorf("%s: no line %q", path, strings.TrimSpace(begin))
	}
	_, after, ok := strings.Cut(rest, end)
	if !ok {
		return fmt.Errorf("%s: no line %q after the first marker", path, strings.TrimSpace(end))
	}
	return os.WriteFile(path, []byte(before+begin+"\n"+text+end+after), 0o644)
}
