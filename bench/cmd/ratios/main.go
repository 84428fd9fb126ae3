// Ratios reads raw `go test -bench` output and prints, for each case, every
// library's figures as ratios to the best peer: the peers are every
// library but direct (the floor) and llmretry (the contestant).
//
// Usage:
//
//	go run ./cmd/ratios results.txt
//
// A benchmark named Benchmark<Case>/<library>-<procs> is one library in one
// case; the case may itself hold a slash (WaitPrecision/10ms). Each figure
// is the median over the runs (-count), as benchstat reports it.
//
// Cases that report only the standard units (ns/op, B/op, allocs/op) are
// shown as time, bytes and allocations per op, each as a ratio to the
// fastest peer by time. Cases that report units of their own (B/parked,
// over-p50-ns, ...) are shown in those units only, each as a ratio to the
// peer lowest in that unit; lower is better in all of them.
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// notPeers are the libraries left out when choosing the reference.
var notPeers = map[string]bool{"direct": true, "llmretry": true}

// standard are the units the testing package reports for every benchmark.
var standard = []string{"ns/op", "B/op", "allocs/op"}

// procsSuffix is the GOMAXPROCS suffix go test adds to benchmark names.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// caseData is one case: its libraries in the order first seen, and every
// sample of every unit for each.
type caseData struct {
	name    string
	libs    []string
	units   []string                        // in the order first seen
	samples map[string]map[string][]float64 // lib -> unit -> samples
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ratios RESULTS_FILE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratios:", err)
		os.Exit(1)
	}
	defer f.Close()
	cases, err := parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratios:", err)
		os.Exit(1)
	}
	if len(cases) == 0 {
		fmt.Fprintln(os.Stderr, "ratios: no benchmark lines in", os.Args[1])
		os.Exit(1)
	}
	for _, c := range cases {
		report(os.Stdout, c)
	}
}

// parse collects the benchmark lines of r by case and library.
func parse(r io.Reader) ([]*caseData, error) {
	var cases []*caseData
	byName := map[string]*caseData{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// Benchmark<name> <iterations> (<value> <unit>)...
		if len(fields) < 4 || len(fields)%2 != 0 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			continue
		}
		name := procsSuffix.ReplaceAllString(strings.TrimPrefix(fields[0], "Benchmark"), "")
		slash := strings.LastIndexByte(name, '/')
		if slash < 0 {
			continue // not one library in a case
		}
		cname, lib := name[:slash], name[slash+1:]
		c := byName[cname]
		if c == nil {
			c = &caseData{name: cname, samples: map[string]map[string][]float64{}}
			byName[cname] = c
			cases = append(cases, c)
		}
		if c.samples[lib] == nil {
			c.samples[lib] = map[string][]float64{}
			c.libs = append(c.libs, lib)
		}
		for i := 2; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: value %q: %v", fields[0], fields[i], err)
			}
			unit := fields[i+1]
			if !slices.Contains(c.units, unit) {
				c.units = append(c.units, unit)
			}
			c.samples[lib][unit] = append(c.samples[lib][unit], v)
		}
	}
	return cases, sc.Err()
}

// median returns the median of xs, or NaN when there are none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// best returns the peer with the lowest median in unit, or "" when no peer
// reports it.
func best(c *caseData, unit string) string {
	ref, refV := "", math.Inf(1)
	for _, lib := range c.libs {
		if notPeers[lib] {
			continue
		}
		if v := median(c.samples[lib][unit]); v < refV {
			ref, refV = lib, v
		}
	}
	return ref
}

// report prints one case's table.
func report(w io.Writer, c *caseData) {
	var units []string
	for _, u := range c.units {
		if !slices.Contains(standard, u) {
			units = append(units, u)
		}
	}
	refs := make([]string, 0, 3)
	switch {
	case len(units) == 0:
		// Overhead case: one reference, the fastest peer.
		units = standard
		ref := best(c, "ns/op")
		for range units {
			refs = append(refs, ref)
		}
		fmt.Fprintf(w, "%s (ratios to the fastest peer, %s)\n", c.name, ref)
	default:
		for _, u := range units {
			refs = append(refs, best(c, u))
		}
		fmt.Fprintf(w, "%s (ratios to the lowest peer in each column)\n", c.name)
	}

	fmt.Fprintf(w, "  %-12s", "library")
	for _, u := range units {
		fmt.Fprintf(w, " %14s %7s", u, "ratio")
	}
	fmt.Fprintln(w)
	for _, lib := range c.libs {
		fmt.Fprintf(w, "  %-12s", lib)
		for i, u := range units {
			v := median(c.samples[lib][u])
			refV := math.NaN()
			if refs[i] != "" {
				refV = median(c.samples[refs[i]][u])
			}
			fmt.Fprintf(w, " %14s %7s", format(v, u), ratio(v, refV))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// ratio formats v/ref. Against a zero reference (a peer that allocates
// nothing) it gives the difference instead, as "+3", and "1.00x" when v is
// zero too; "-" when either value is missing.
func ratio(v, ref float64) string {
	switch {
	case math.IsNaN(v) || math.IsNaN(ref):
		return "-"
	case ref == 0 && v == 0:
		return "1.00x"
	case ref == 0:
		return "+" + strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v/ref, 'f', 2, 64) + "x"
}

// format prints a value in its unit: durations for units counted in
// nanoseconds, plain numbers otherwise.
func format(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case unit == "ns/op" || strings.HasSuffix(unit, "-ns"):
		return duration(v)
	case v == math.Trunc(v) || math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// duration prints ns nanoseconds in the largest unit that keeps it at
// least 1, with about three significant digits.
func duration(ns float64) string {
	name, x := "ns", ns
	for _, u := range []struct {
		name string
		size float64
	}{{"s", 1e9}, {"ms", 1e6}, {"µs", 1e3}} {
		if math.Abs(ns) >= u.size {
			name, x = u.name, ns/u.size
			break
		}
	}
	decimals := 2
	switch a := math.Abs(x); {
	case a >= 100:
		decimals = 0
	case a >= 10:
		decimals = 1
	}
	return strconv.FormatFloat(x, 'f', decimals, 64) + name
}
