package outage

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// colours gives each strategy a colour that stays the same in every
// picture, whether or not the build has the Breaker rows; llmretry's rows
// are black, red and pink (the Breaker paced), and drawn thicker.
var colours = map[string]color.Color{
	nameLLMRetry:     color.RGBA{R: 0x11, G: 0x11, B: 0x11, A: 0xff},
	nameBreaker:      color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	namePaced:        color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	nameFailsafe:     color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	nameFailsafeCB:   color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	nameBackoffTries: color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	nameBackoffTime:  color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
	nameRetryGo:      color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	nameGoRetry:      color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	nameOpenAI:       color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},

	// The fleet rows, in the colours of the rows they extend.
	nameFleetBreaker: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	nameFleetPaced:   color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	nameFleetShared:  color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// WritePacingSVG draws one scenario for the Breaker rows alone, without
// and with pacing: requests sent per 10 s above, requests answered 429
// per 10 s (by when they were sent) below, so that the 429s a paced
// Breaker did not pay for show against the requests it sent instead.
func WritePacingSVG(w io.Writer, sc *Scenario, results []*Result) error {
	var rows []*Result
	for _, r := range results {
		if r.Breaker {
			rows = append(rows, r)
		}
	}
	top, err := series(rows, func(r *Result) []int { return r.SentBins })
	if err != nil {
		return err
	}
	top.Title.Text = sc.Name + ": the Breaker without and with pacing"
	top.Y.Label.Text = "requests sent per 10 s"
	bottom, err := series(rows, func(r *Result) []int {
		// A row with no 429 still gets its line, flat at zero, over the
		// run.
		b := make([]int, max(len(r.Bins429), len(r.SentBins)))
		copy(b, r.Bins429)
		return b
	})
	if err != nil {
		return err
	}
	bottom.Y.Label.Text = "requests answered 429 per 10 s (by send)"
	bottom.X.Label.Text = "minutes since the start of the run"
	top.X.Max = max(top.X.Max, bottom.X.Max)
	bottom.X.Max = top.X.Max

	c := vgsvg.New(9*vg.Inch, 6*vg.Inch)
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(12)}, draw.New(c))
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	_, err = c.WriteTo(w)
	return err
}

// WriteSVG draws one scenario: answers per 10 s above, requests sent per
// 10 s below, over the minutes of the run, one line per strategy.
func WriteSVG(w io.Writer, n int, sc *Scenario, results []*Result) error {
	c := vgsvg.New(9*vg.Inch, 9*vg.Inch)
	if err := drawFigure(draw.New(c), n, sc, results); err != nil {
		return err
	}
	_, err := c.WriteTo(w)
	return err
}

// drawFigure draws WriteSVG's picture on dc.
func drawFigure(dc draw.Canvas, n int, sc *Scenario, results []*Result) error {
	top, err := series(results, func(r *Result) []int { return r.AnsBins })
	if err != nil {
		return err
	}
	top.Title.Text = fmt.Sprintf("%d. %s", n, sc.Name)
	top.Y.Label.Text = "answers per 10 s"
	bottom, err := series(results, func(r *Result) []int { return r.SentBins })
	if err != nil {
		return err
	}
	bottom.Y.Label.Text = "requests sent per 10 s"
	bottom.X.Label.Text = "minutes since the start of the run"
	bottom.Legend = plot.NewLegend()
	// One time axis for both, so that an answer lines up with the
	// requests that bought it.
	top.X.Max = max(top.X.Max, bottom.X.Max)
	bottom.X.Max = top.X.Max

	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(12)}, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	return nil
}

// series makes a plot with one line per strategy from each result's bins.
func series(results []*Result, bins func(*Result) []int) (*plot.Plot, error) {
	p := plot.New()
	p.Legend.Top = true
	p.Legend.Left = false
	p.Y.Min = 0
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	for _, r := range results {
		b := bins(r)
		xys := make(plotter.XYs, 0, len(b)+1)
		for j, v := range b {
			// Each point sits at the middle of its bin.
			xys = append(xys, plotter.XY{X: (float64(j) + 0.5) * bin.Minutes(), Y: float64(v)})
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = colours[r.Strategy]
		l.Width = vg.Points(1)
		if !r.Peer {
			l.Width = vg.Points(2.5)
		}
		p.Add(l)
		p.Legend.Add(r.Strategy, l)
	}
	return p, nil
}
