package outage

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WritePoolMarkdown writes the table of one pool scenario played by
// fleets of every size: one row per fleet size and strategy. Capacity
// used is the requests answered over what the deployments' buckets
// refill over the arrivals (bursts left out), at the scenario's mean
// cost; spillover is the share of the answers from a deployment of a
// tier above 0; each deployment's requests are those sent to it, with
// its answers of 429 in brackets.
func WritePoolMarkdown(w io.Writer, sc *Scenario, sizes []int, results [][]*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "#### %s\n\n%s.\n\n", sc.Name, sc.About)
	b.WriteString("| N | strategy | answered in deadline | 429s (of requests) | capacity used | p50 | p95 | spillover | requests (429s) per deployment |\n")
	b.WriteString("|--:|---|--:|--:|--:|--:|--:|--:|---|\n")
	for i, n := range sizes {
		for _, r := range results[i] {
			fmt.Fprintf(&b, "| %d | %s | %s (%d) | %d (%s) | %s | %s | %s | %s | %s |\n",
				n, r.Strategy, percent(r.Answered, r.Requests), r.Answered,
				r.Got429, percent(r.Got429, r.Requests), capacityUsed(sc, r),
				seconds(r.P50), seconds(r.P95), spillover(sc, r), perDeployment(sc, r))
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// capacityUsed is the share of the scenario's summed capacity that r's
// answers used.
func capacityUsed(sc *Scenario, r *Result) string {
	return fmt.Sprintf("%.1f%%", 100*usedShare(sc, r))
}

func usedShare(sc *Scenario, r *Result) float64 {
	return float64(r.Answered) / sc.capacity()
}

// spilled is how many of r's answers came from a tier above 0.
func spilled(sc *Scenario, r *Result) int {
	n := 0
	for d, p := range sc.providers() {
		if p.Tier > 0 && d < len(r.AnsweredBy) {
			n += r.AnsweredBy[d]
		}
	}
	return n
}

// spillover is the share of r's answers from a tier above 0; "-" for a
// scenario of one tier.
func spillover(sc *Scenario, r *Result) string {
	for _, p := range sc.providers() {
		if p.Tier > 0 {
			return percent(spilled(sc, r), r.Answered)
		}
	}
	return "-"
}

// perDeployment lists each deployment's requests and 429s.
func perDeployment(sc *Scenario, r *Result) string {
	var parts []string
	for d, p := range sc.providers() {
		parts = append(parts, fmt.Sprintf("%s %d (%d)", p.Name, r.SentBy[d], r.Got429By[d]))
	}
	return strings.Join(parts, ", ")
}

// deploymentColours tell a pool's deployments apart in its picture.
var deploymentColours = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// WritePoolSVG draws one pool scenario played by a fleet of n processes:
// one row of two plots per strategy, the requests sent to each
// deployment per 10 s on the left and those answered 429 (by when they
// were sent) on the right, one line per deployment.
func WritePoolSVG(w io.Writer, sc *Scenario, n int, results []*Result) error {
	provs := sc.providers()
	grid := make([][]*plot.Plot, len(results))
	top := 0.0
	for i, r := range results {
		sent, err := perDeploymentPlot(provs, r.SentBinsBy)
		if err != nil {
			return err
		}
		got, err := perDeploymentPlot(provs, r.Bins429By)
		if err != nil {
			return err
		}
		sent.Title.Text = r.Strategy
		sent.Y.Label.Text = "sent / 10 s"
		got.Title.Text = r.Strategy
		got.Y.Label.Text = "429s / 10 s"
		if i == 0 {
			sent.Title.Text = fmt.Sprintf("%s over %d processes: %s", sc.Name, n, r.Strategy)
		}
		if i == len(results)-1 {
			sent.X.Label.Text = "minutes since the start of the run"
			got.X.Label.Text = sent.X.Label.Text
		}
		top = max(top, sent.Y.Max, got.Y.Max)
		grid[i] = []*plot.Plot{sent, got}
	}
	// One scale for every plot, so that rows compare at a glance.
	span := sc.span().Minutes() + sc.Deadline.Minutes()
	for _, row := range grid {
		for _, p := range row {
			p.Y.Max, p.X.Max = top, span
		}
	}
	c := vgsvg.New(10*vg.Inch, vg.Length(len(results))*2*vg.Inch)
	canvases := plot.Align(grid, draw.Tiles{Rows: len(results), Cols: 2, PadY: vg.Points(8), PadX: vg.Points(12)}, draw.New(c))
	for i := range grid {
		for j := range grid[i] {
			grid[i][j].Draw(canvases[i][j])
		}
	}
	_, err := c.WriteTo(w)
	return err
}

// perDeploymentPlot is a plot with one line per deployment from its bins.
func perDeploymentPlot(provs []*Provider, bins [][]int) (*plot.Plot, error) {
	p := plot.New()
	p.Legend.Top = true
	p.X.Min, p.Y.Min = 0, 0
	p.Add(plotter.NewGrid())
	for d, prov := range provs {
		xys := plotter.XYs{}
		for j, v := range bins[d] {
			xys = append(xys, plotter.XY{X: (float64(j) + 0.5) * bin.Minutes(), Y: float64(v)})
		}
		if len(xys) == 0 {
			xys = append(xys, plotter.XY{})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = deploymentColours[d%len(deploymentColours)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(prov.Name, l)
	}
	return p, nil
}
