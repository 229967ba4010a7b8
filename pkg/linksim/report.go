package linksim

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Summary is one policy's results over seeds.
type Summary struct {
	Policy string
	Seeds  int
	// Allocation is the mean of the seeds' allocation, in percent.
	Allocation float64
	// OnNVLink and AtBest are, by pod size, the percentage of the placed
	// pods of that size (all seeds together) on NVLink and on the best link
	// their node's shape offers.
	OnNVLink, AtBest map[int]float64
	// MeanWaitSeconds is the mean over seeds of multi-card pods' mean wait;
	// Waiting the mean of pods left waiting.
	MeanWaitSeconds, Waiting float64
}

// Summarize groups results by policy, in the order of policies.
func Summarize(results []*Result, policies []Policy) []Summary {
	var out []Summary
	for _, p := range policies {
		s := Summary{Policy: p.Name, OnNVLink: map[int]float64{}, AtBest: map[int]float64{}}
		placed, nv, best := map[int]int{}, map[int]int{}, map[int]int{}
		for _, r := range results {
			if r.Policy != p.Name {
				continue
			}
			s.Seeds++
			s.Allocation += 100 * r.Allocation
			s.MeanWaitSeconds += r.MeanWaitSeconds
			s.Waiting += float64(r.Waiting)
			for k, v := range r.Placed {
				placed[k] += v
				nv[k] += r.OnNVLink[k]
				best[k] += r.AtBest[k]
			}
		}
		if s.Seeds == 0 {
			continue
		}
		s.Allocation /= float64(s.Seeds)
		s.MeanWaitSeconds /= float64(s.Seeds)
		s.Waiting /= float64(s.Seeds)
		for k, n := range placed {
			if k > 1 && n > 0 {
				s.OnNVLink[k] = 100 * float64(nv[k]) / float64(n)
				s.AtBest[k] = 100 * float64(best[k]) / float64(n)
			}
		}
		out = append(out, s)
	}
	return out
}

// Table is the summaries as a Markdown table.
func Table(summaries []Summary) string {
	var b strings.Builder
	b.WriteString("| policy | GPU allocated % | 2-card on NVLink % | 4-card on NVLink % | 8-card on NVLink % | 2 / 4 / 8-card on their node's best link % | multi-card mean wait (min) | pods left waiting |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, s := range summaries {
		fmt.Fprintf(&b, "| %s | %.2f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.1f | %.1f |\n", s.Policy, s.Allocation,
			s.OnNVLink[2], s.OnNVLink[4], s.OnNVLink[8], s.AtBest[2], s.AtBest[4], s.AtBest[8], s.MeanWaitSeconds/60, s.Waiting)
	}
	return b.String()
}

// Plot draws, per policy, the share of 2-, 4- and 8-card pods placed on
// NVLink, as grouped bars. The file type follows path's extension.
func Plot(path, title string, summaries []Summary) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "pods on NVLink (% of those placed)"
	p.Legend.Top = true
	names := make([]string, len(summaries))
	for i, s := range summaries {
		names[i] = s.Policy
	}
	colors := []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
	w := vg.Points(12)
	for i, size := range []int{2, 4, 8} {
		values := make(plotter.Values, len(summaries))
		for j, s := range summaries {
			values[j] = s.OnNVLink[size]
		}
		bars, err := plotter.NewBarChart(values, w)
		if err != nil {
			return err
		}
		bars.Color = colors[i]
		bars.Offset = w * vg.Length(i-1)
		p.Add(bars)
		p.Legend.Add(fmt.Sprintf("%d-card pods", size), bars)
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = -0.9, -0.4
	p.Y.Min, p.Y.Max = 0, 100
	return p.Save(10*vg.Inch, 6*vg.Inch, path)
}
