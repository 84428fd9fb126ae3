package scale

import (
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

func drawCanvas(c *vgsvg.Canvas) draw.Canvas { return draw.New(c) }
