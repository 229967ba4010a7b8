package simreport

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// ReferencePolicies are the artifact's curves drawn beside Tessera's.
var ReferencePolicies = []string{"06-FGD", "05-BestFit"}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// Plot draws GPU allocation against arrived workload for one trace: each of
// Tessera's policies solid, the artifact's reference policies dashed, and the
// line every arrived task placed would follow. The file type follows the
// extension of path (.png, .svg, .pdf).
func Plot(path, trace string, tessera, artifact []Mean) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("openb %s: GPU allocation vs arrived workload (mean of seeds)", trace)
	p.X.Label.Text = "arrived GPU workload (% of capacity)"
	p.Y.Label.Text = "GPU allocated (% of capacity)"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Millimeter*2, vg.Millimeter*10

	ideal := plotter.XYs{{X: 0, Y: 0}, {X: 100, Y: 100}, {X: 130, Y: 100}}
	if err := addLine(p, "every task placed", ideal, color.Gray{Y: 0x90}, []vg.Length{vg.Points(1), vg.Points(3)}); err != nil {
		return err
	}
	i := 0
	for _, m := range tessera {
		if m.Trace != trace {
			continue
		}
		label := fmt.Sprintf("Tessera %s (%.2f%% unallocated)", m.Policy, m.Unallocated())
		if err := addLine(p, label, curve(m.Allocation), palette[i%len(palette)], nil); err != nil {
			return err
		}
		i++
	}
	for _, m := range artifact {
		if m.Trace != trace {
			continue
		}
		for j, ref := range ReferencePolicies {
			if m.Policy != ref {
				continue
			}
			label := fmt.Sprintf("artifact %s (%.2f%%)", m.Policy, m.Unallocated())
			if err := addLine(p, label, curve(m.Allocation), palette[(i+j)%len(palette)], []vg.Length{vg.Points(5), vg.Points(3)}); err != nil {
				return err
			}
		}
	}
	// Every policy places everything until the cluster nears full: the plot
	// starts at half the capacity, where they part. (Set after Add, which
	// widens the axes to the data.)
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 50, 130, 50, 100
	return p.Save(9*vg.Inch, 6*vg.Inch, path)
}

func curve(allocation []float64) plotter.XYs {
	xys := make(plotter.XYs, len(allocation))
	for x, y := range allocation {
		xys[x] = plotter.XY{X: float64(x), Y: y}
	}
	return xys
}

func addLine(p *plot.Plot, label string, xys plotter.XYs, c color.Color, dashes []vg.Length) error {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.LineStyle = draw.LineStyle{Color: c, Width: vg.Points(1.5), Dashes: dashes}
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}

// PlotDepartures draws, for one setup, each policy's GPU allocation over the
// arrival window (solid) and the GPU its arrived, unfinished tasks ask
// (dashed, same colour): the gap is what waits. The file type follows the
// extension of path.
func PlotDepartures(path string, setup DepartureSetup, means []DepartureMean) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("openb %s with departures, offered load %.2f, %s: GPU over time (mean of seeds)", setup.Trace, setup.Load, setup.FleetName())
	p.X.Label.Text = "time (% of the arrival window)"
	p.Y.Label.Text = "GPU (% of capacity)"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Millimeter*2, vg.Millimeter*10
	i := 0
	for _, m := range means {
		if m.DepartureSetup != setup {
			continue
		}
		c := palette[i%len(palette)]
		i++
		label := fmt.Sprintf("%s allocated (%.2f%% in the second half)", m.Policy, m.MeanAllocation)
		if err := addLine(p, label, curve(m.Allocation), c, nil); err != nil {
			return err
		}
		if err := addLine(p, m.Policy+" offered", curve(m.Offered), c, []vg.Length{vg.Points(5), vg.Points(3)}); err != nil {
			return err
		}
	}
	if i == 0 {
		return fmt.Errorf("no departures replays of %s at load %.2f on %s", setup.Trace, setup.Load, setup.FleetName())
	}
	p.X.Min, p.X.Max, p.Y.Min = 0, 100, 0
	return p.Save(9*vg.Inch, 6*vg.Inch, path)
}
