package main

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"sort"
	"strconv"
)

// The latency plot: p50, p90, p99 and p99.9 against the achieved write
// rate, both axes logarithmic, drawn with the standard library only.
const (
	plotW, plotH = 960, 600
	marginLeft   = 100
	marginRight  = 40
	marginTop    = 100
	marginBottom = 80
)

var (
	colBackground = color.RGBA{255, 255, 255, 255}
	colAxis       = color.RGBA{40, 40, 40, 255}
	colGrid       = color.RGBA{225, 225, 225, 255}
	colMinorGrid  = color.RGBA{242, 242, 242, 255}
	colText       = color.RGBA{20, 20, 20, 255}
	colMuted      = color.RGBA{110, 110, 110, 255}
)

// series are the percentiles drawn, in legend order.
var series = []struct {
	label string
	col   color.RGBA
	value func(Percentiles) float64
}{
	{"P50", color.RGBA{31, 119, 180, 255}, func(p Percentiles) float64 { return p.P50 }},
	{"P90", color.RGBA{44, 160, 44, 255}, func(p Percentiles) float64 { return p.P90 }},
	{"P99", color.RGBA{255, 127, 14, 255}, func(p Percentiles) float64 { return p.P99 }},
	{"P99.9", color.RGBA{214, 39, 40, 255}, func(p Percentiles) float64 { return p.P999 }},
}

// logAxis maps values to pixels on a log10 scale between two 1-2-5 values.
type logAxis struct {
	lo, hi     float64 // log10 of the ends
	pxLo, pxHi int
}

// steps125 returns the 1-2-5 values from below lo to above hi.
func steps125(lo, hi float64) []float64 {
	var out []float64
	for e := math.Floor(math.Log10(lo)) - 1; e <= math.Ceil(math.Log10(hi))+1; e++ {
		for _, m := range []float64{1, 2, 5} {
			out = append(out, m*math.Pow(10, e))
		}
	}
	return out
}

// newLogAxis spans minV..maxV with some room, snapped outwards to 1-2-5
// values.
func newLogAxis(minV, maxV float64, pxLo, pxHi int) logAxis {
	minV, maxV = minV/1.25, maxV*1.25
	steps := steps125(minV, maxV)
	lo, hi := steps[0], steps[len(steps)-1]
	for _, v := range steps {
		if v <= minV {
			lo = v
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i] >= maxV {
			hi = steps[i]
		}
	}
	return logAxis{lo: math.Log10(lo), hi: math.Log10(hi), pxLo: pxLo, pxHi: pxHi}
}

func (a logAxis) px(v float64) int {
	f := (math.Log10(v) - a.lo) / (a.hi - a.lo)
	return a.pxLo + int(math.Round(f*float64(a.pxHi-a.pxLo)))
}

// ticks returns the 1-2-5 values within the axis, and whether each gets a
// label (all of them on a short axis, the powers of ten on a long one).
func (a logAxis) ticks() (values []float64, labeled []bool) {
	long := a.hi-a.lo > 3
	for _, v := range steps125(math.Pow(10, a.lo), math.Pow(10, a.hi)) {
		l := math.Log10(v)
		if l < a.lo-1e-9 || l > a.hi+1e-9 {
			continue
		}
		values = append(values, v)
		labeled = append(labeled, !long || math.Abs(l-math.Round(l)) < 1e-9)
	}
	return values, labeled
}

// formatTick prints a tick value without needless digits: 0.01, 0.5, 20, 5000.
func formatTick(v float64) string {
	if v >= 1 {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// writeLatencyPlot draws the percentiles of the latency results that have
// data against their achieved rate, as a PNG.
func writeLatencyPlot(w io.Writer, results []LatencyResult, mode string) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), &image.Uniform{colBackground}, image.Point{}, draw.Src)

	title := "PGOUTBOX LATENCY, COMMIT TO CONSUMER"
	drawText(img, (plotW-textWidth(title, 3))/2, 16, title, colText, 3)
	sub := "PERCENTILES AGAINST ACHIEVED WRITE RATE, SINGLE-EVENT TRANSACTIONS"
	if mode == "smoke" {
		sub = "SMOKE RUN: THE NUMBERS MEAN NOTHING"
	}
	drawText(img, (plotW-textWidth(sub, 2))/2, 46, sub, colMuted, 2)

	var pts []LatencyResult
	for _, r := range results {
		if r.Received > 0 && r.AchievedRate > 0 && r.LatencyMs.P50 > 0 {
			pts = append(pts, r)
		}
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].AchievedRate < pts[j].AchievedRate })

	left, right := marginLeft, plotW-marginRight
	top, bottom := marginTop, plotH-marginBottom
	minX, maxX := 100.0, 10000.0
	minY, maxY := 1.0, 100.0
	if len(pts) > 0 {
		minX, maxX = math.Inf(1), 0
		minY, maxY = math.Inf(1), 0
		for _, p := range pts {
			minX, maxX = math.Min(minX, p.AchievedRate), math.Max(maxX, p.AchievedRate)
			for _, s := range series {
				v := math.Max(s.value(p.LatencyMs), 0.01) // log scale: floor at 10 µs
				minY, maxY = math.Min(minY, v), math.Max(maxY, v)
			}
		}
	}
	xa := newLogAxis(minX, maxX, left, right)
	ya := newLogAxis(minY, maxY, bottom, top) // pixels grow downwards

	// Grid and tick labels.
	xs, xl := xa.ticks()
	for i, v := range xs {
		x := xa.px(v)
		c := colMinorGrid
		if xl[i] {
			c = colGrid
		}
		fillRect(img, x, top, 1, bottom-top, c)
		fillRect(img, x, bottom, 1, 6, colAxis)
		if xl[i] {
			s := formatTick(v)
			drawText(img, x-textWidth(s, 2)/2, bottom+12, s, colText, 2)
		}
	}
	ys, yl := ya.ticks()
	for i, v := range ys {
		y := ya.px(v)
		c := colMinorGrid
		if yl[i] {
			c = colGrid
		}
		fillRect(img, left, y, right-left, 1, c)
		fillRect(img, left-6, y, 6, 1, colAxis)
		if yl[i] {
			s := formatTick(v)
			drawText(img, left-12-textWidth(s, 2), y-textHeight(2)/2, s, colText, 2)
		}
	}
	// Axes.
	fillRect(img, left, top, 2, bottom-top+1, colAxis)
	fillRect(img, left, bottom, right-left+1, 2, colAxis)
	xlabel := "WRITE RATE, EVENTS/S (LOG)"
	drawText(img, (left+right-textWidth(xlabel, 2))/2, bottom+40, xlabel, colText, 2)
	ylabel := "LATENCY, MS (LOG)"
	drawTextUp(img, 14, (top+bottom+textWidth(ylabel, 2))/2, ylabel, colText, 2)

	if len(pts) == 0 {
		msg := "NO LATENCY DATA"
		drawText(img, (left+right-textWidth(msg, 3))/2, (top+bottom)/2, msg, colMuted, 3)
	}
	// The series: lines between rates, a marker at each.
	for _, s := range series {
		prevX, prevY := -1, -1
		for _, p := range pts {
			x, y := xa.px(p.AchievedRate), ya.px(math.Max(s.value(p.LatencyMs), 0.01))
			if prevX >= 0 {
				drawLine(img, prevX, prevY, x, y, 3, s.col)
			}
			fillRect(img, x-4, y-4, 9, 9, s.col)
			prevX, prevY = x, y
		}
	}
	// Legend: one row between the subtitle and the plot.
	itemW := 20 + 10 + textWidth("P99.9", 2) + 30
	lx := (plotW - len(series)*itemW) / 2
	ly := 72
	for i, s := range series {
		x := lx + i*itemW
		fillRect(img, x, ly+5, 20, 4, s.col)
		fillRect(img, x+6, ly+3, 8, 8, s.col)
		drawText(img, x+30, ly, s.label, colText, 2)
	}
	return png.Encode(w, img)
}

func strokeRect(img *image.RGBA, x, y, w, h int, c color.Color) {
	fillRect(img, x, y, w, 1, c)
	fillRect(img, x, y+h-1, w, 1, c)
	fillRect(img, x, y, 1, h, c)
	fillRect(img, x+w-1, y, 1, h, c)
}

// drawLine draws a line of the given thickness (Bresenham, a square brush).
func drawLine(img *image.RGBA, x0, y0, x1, y1, thick int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	half := thick / 2
	for {
		fillRect(img, x0-half, y0-half, thick, thick, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
