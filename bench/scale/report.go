package scale

import (
	"fmt"
	"image/color"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// CPUSizes and StoreSizes are the call counts the report measures.
var (
	CPUSizes   = []int{250, 500, 1250, 2500, 5000, 10000}
	StoreSizes = []int{25, 50, 100, 200, 400}
)

// Median runs load three times and keeps the run of median CPU: the
// machine's other work only ever adds to a run.
func Median(load func() Result) Result {
	rs := []Result{load(), load(), load()}
	slices.SortFunc(rs, func(a, b Result) int { return int(a.CPU - b.CPU) })
	return rs[1]
}

// Report is the figures of every load at every size.
type Report struct {
	CPU   map[string][]Result // by load, in CPUSizes order
	Store map[string][]Result // by load, in StoreSizes order
}

// Measure measures every load at every size.
func Measure(t *testing.T) Report {
	r := Report{CPU: map[string][]Result{}, Store: map[string][]Result{}}
	for _, n := range CPUSizes {
		for _, res := range []Result{
			Median(func() Result { return InFlight(t, n, false) }),
			Median(func() Result { return InFlight(t, n, true) }),
			Median(func() Result { return DrainClosing(t, n) }),
			Median(func() Result { return DrainPaced(t, n) }),
		} {
			r.CPU[res.Load] = append(r.CPU[res.Load], res)
		}
	}
	for _, n := range StoreSizes {
		for _, res := range []Result{StoreWaiting(t, n), StoreClosing(t, n)} {
			r.Store[res.Load] = append(r.Store[res.Load], res)
		}
	}
	return r
}

// cpuLoads are the CPU loads, in the report's order.
var cpuLoads = []string{"in flight, no Breaker", "in flight, Breaker", "drain, closing", "drain, paced"}

// storeLoads are the store loads, in the report's order.
var storeLoads = []string{"store, paced, 4 processes", "store, closing, 4 processes"}

// WriteMarkdown writes the report's tables.
func (r Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("CPU of one play of each load (the median of three measures, each over at least 20,000 calls), and its growth from the smallest size; linear growth is the size's ratio.\n\n")
	b.WriteString("| calls |")
	for _, l := range cpuLoads {
		fmt.Fprintf(&b, " %s |", l)
	}
	b.WriteString(" Breaker / none, in flight |\n|--:|")
	for range cpuLoads {
		b.WriteString("--:|")
	}
	b.WriteString("--:|\n")
	for i, n := range CPUSizes {
		fmt.Fprintf(&b, "| %d (×%g) |", n, float64(n)/float64(CPUSizes[0]))
		for _, l := range cpuLoads {
			res := r.CPU[l][i]
			fmt.Fprintf(&b, " %s (×%.1f) |", cpuTime(res.CPU), float64(res.CPU)/float64(r.CPU[l][0].CPU))
		}
		fmt.Fprintf(&b, " %.2f |\n", float64(r.CPU[cpuLoads[1]][i].CPU)/float64(r.CPU[cpuLoads[0]][i].CPU))
	}
	b.WriteString("\nStore calls per waiting call, four processes sharing one in-memory store at 1 ms a call whose notices carry no state (a store that is not an llmretry.StateNotifier): the loads are what waking the calls in their turn costs. With notices that carry the state, as pgbreaker's and llmretrytest.MemoryStore's do, the same runs load nothing.\n\n| calls | paced: loads | paced: swaps | closing: loads | closing: swaps |\n|--:|--:|--:|--:|--:|\n")
	for i, n := range StoreSizes {
		p, c := r.Store[storeLoads[0]][i], r.Store[storeLoads[1]][i]
		fmt.Fprintf(&b, "| %d | %.2f | %.2f | %.2f | %.2f |\n", n,
			per(p.Loads, n), per(p.Swaps, n), per(c.Loads, n), per(c.Swaps, n))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func per(x int64, n int) float64 { return float64(x) / float64(n) }

func cpuTime(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// WriteSVG draws the CPU of each load against the calls, on log scales.
func (r Report) WriteSVG(w io.Writer) error {
	p := plot.New()
	p.Title.Text = "CPU against calls in flight or waiting (log-log)"
	p.X.Label.Text = "calls"
	p.Y.Label.Text = "CPU, seconds"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{}, plot.LogTicks{}
	colours := []color.Color{
		color.RGBA{R: 0x11, G: 0x11, B: 0x11, A: 0xff},
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
	for i, l := range cpuLoads {
		pts := make(plotter.XYs, len(CPUSizes))
		for j, n := range CPUSizes {
			pts[j].X, pts[j].Y = float64(n), max(r.CPU[l][j].CPU.Seconds(), 1e-4)
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color, line.Width = colours[i], vg.Points(2)
		p.Add(line)
		p.Legend.Add(l, line)
	}
	p.Legend.Top, p.Legend.Left = true, true
	c := vgsvg.New(8*vg.Inch, 5*vg.Inch)
	p.Draw(drawCanvas(c))
	_, err := c.WriteTo(w)
	return err
}
