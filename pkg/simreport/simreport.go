// Package simreport turns trace replays into what people compare: the FGD
// artifact's CSV layout, a table of unallocated GPU at arrived = 100 % beside
// the artifact's figures, and a plot of allocation against arrived workload.
package simreport

import (
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/sim"
)

// TracePrefix is how the artifact names a task list: the file name without
// ".csv".
const TracePrefix = "openb_pod_list_"

// ArtifactPolicies are the artifact's policies, in its order.
var ArtifactPolicies = []string{"01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD"}

// Run is one replay's curve, as a row of the artifact's CSV.
type Run struct {
	// Trace is the task list's short name, e.g. "default".
	Trace string
	// Policy is a Tessera profile or an artifact policy.
	Policy    string
	Seed      uint64
	TotalGPUs int
	// Allocation is indexed by arrived percent, 0..sim.MaxArrivedPercent.
	Allocation []float64
}

// FromResult wraps a replay's result.
func FromResult(trace string, r *sim.Result) Run {
	return Run{Trace: trace, Policy: r.Profile, Seed: r.Seed, TotalGPUs: r.TotalGPUs, Allocation: r.Allocation}
}

// Unallocated is 100 minus the allocation at arrived = 100 %.
func (r Run) Unallocated() float64 { return 100 - r.Allocation[100] }

// header is the artifact's CSV header.
func header() []string {
	h := []string{"workload", "sc_policy", "tune", "seed", "total_gpus"}
	for p := 0; p <= sim.MaxArrivedPercent; p++ {
		h = append(h, strconv.Itoa(p))
	}
	return h
}

// WriteCSV writes runs in the artifact's column layout.
func WriteCSV(w io.Writer, runs []Run) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header()); err != nil {
		return err
	}
	for _, r := range runs {
		row := []string{TracePrefix + r.Trace, r.Policy, strconv.FormatFloat(sim.Padding, 'f', -1, 64), strconv.FormatUint(r.Seed, 10), strconv.Itoa(r.TotalGPUs)}
		for _, v := range r.Allocation {
			row = append(row, strconv.FormatFloat(v, 'f', 2, 64))
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ReadCSV reads runs in the artifact's layout: the artifact's own file, or
// one WriteCSV wrote.
func ReadCSV(r io.Reader) ([]Run, error) {
	records, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(records) == 0 || len(records[0]) < 5+sim.MaxArrivedPercent+1 || !slices.Equal(records[0][:5], header()[:5]) {
		return nil, fmt.Errorf("not the artifact's layout: want columns %s,0..%d", strings.Join(header()[:5], ","), sim.MaxArrivedPercent)
	}
	runs := make([]Run, 0, len(records)-1)
	for i, rec := range records[1:] {
		if len(rec) < 5+sim.MaxArrivedPercent+1 {
			return nil, fmt.Errorf("row %d: %d columns, want %d", i+2, len(rec), 5+sim.MaxArrivedPercent+1)
		}
		run := Run{Trace: strings.TrimPrefix(rec[0], TracePrefix), Policy: rec[1], Allocation: make([]float64, sim.MaxArrivedPercent+1)}
		if run.Seed, err = strconv.ParseUint(rec[3], 10, 64); err != nil {
			return nil, fmt.Errorf("row %d: seed: %w", i+2, err)
		}
		if run.TotalGPUs, err = strconv.Atoi(rec[4]); err != nil {
			return nil, fmt.Errorf("row %d: total_gpus: %w", i+2, err)
		}
		for p := range run.Allocation {
			if run.Allocation[p], err = strconv.ParseFloat(rec[5+p], 64); err != nil {
				return nil, fmt.Errorf("row %d: column %d: %w", i+2, p, err)
			}
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// Mean is the seed-averaged curve of one trace and policy.
type Mean struct {
	Trace, Policy string
	Seeds         int
	Allocation    []float64
}

// Unallocated is 100 minus the mean allocation at arrived = 100 %.
func (m Mean) Unallocated() float64 { return 100 - m.Allocation[100] }

// Means averages runs over seeds, per trace and policy, in first-seen order.
func Means(runs []Run) []Mean {
	var out []Mean
	index := map[[2]string]int{}
	for _, r := range runs {
		k := [2]string{r.Trace, r.Policy}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, Mean{Trace: r.Trace, Policy: r.Policy, Allocation: make([]float64, len(r.Allocation))})
		}
		out[i].Seeds++
		for p, v := range r.Allocation {
			out[i].Allocation[p] += v
		}
	}
	for i := range out {
		for p := range out[i].Allocation {
			out[i].Allocation[p] /= float64(out[i].Seeds)
		}
	}
	return out
}

// Table is a Markdown table of unallocated GPU % at arrived = 100 %, one row
// per trace, Tessera's policies then the artifact's, each the mean over its
// seeds (the count in parentheses when it is not 10).
func Table(tessera, artifact []Mean, policies []string, traces []string) string {
	find := func(ms []Mean, trace, policy string) string {
		for _, m := range ms {
			if m.Trace == trace && m.Policy == policy {
				switch m.Seeds {
				case 10:
				case 1:
					return fmt.Sprintf("%.2f (1 seed)", m.Unallocated())
				default:
					return fmt.Sprintf("%.2f (%d seeds)", m.Unallocated(), m.Seeds)
				}
				return fmt.Sprintf("%.2f", m.Unallocated())
			}
		}
		return "–"
	}
	var b strings.Builder
	cols := append(append([]string{"trace"}, policies...), ArtifactPolicies...)
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, t := range traces {
		row := []string{t}
		for _, p := range policies {
			row = append(row, "**"+find(tessera, t, p)+"**")
		}
		for _, p := range ArtifactPolicies {
			row = append(row, find(artifact, t, p))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	return b.String()
}
