package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/simreport"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// boundTableFile is --bound's table.
const boundTableFile = "bound.md"

// runBound computes, for every task list and seed, the lower bound on
// unallocated GPU at arrived = 100 % (sim.AllocationBound) and writes the
// means per list.
func runBound(o options, out io.Writer) error {
	workloads, err := workloadNames(o.traces, o.workloads)
	if err != nil {
		return err
	}
	seeds, err := parseSeeds(o.seeds)
	if err != nil {
		return err
	}
	nodes, err := readFile(filepath.Join(o.traces, nodeFile), trace.ReadNodes)
	if err != nil {
		return err
	}
	capacity := sim.CapacityMilli(sim.GPUNodes(nodes))
	var b strings.Builder
	fmt.Fprintf(&b, "Lower bound on unallocated GPU %% at arrived workload = 100 %% of capacity (sim.AllocationBound; mean over seeds %s).\n\n", o.seeds)
	b.WriteString("| task list | bound on unallocated % | min–max over seeds | seconds |\n|---|---|---|---|\n")
	for _, w := range workloads {
		tasks, err := readFile(filepath.Join(o.traces, simreport.TracePrefix+w+".csv"), trace.ReadTasks)
		if err != nil {
			return err
		}
		start := time.Now()
		var sum float64
		lo, hi := 100.0, 0.0
		for _, s := range seeds {
			bound, err := sim.AllocationBound(nodes, sim.Arrivals(tasks, capacity, s), 100)
			if err != nil {
				return fmt.Errorf("%s, seed %d: %w", w, s, err)
			}
			u := 100 - bound
			sum += u
			lo, hi = min(lo, u), max(hi, u)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f–%.2f | %.1f |\n", w, sum/float64(len(seeds)), lo, hi, time.Since(start).Seconds())
	}
	if err := os.WriteFile(filepath.Join(o.out, boundTableFile), []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprint(out, b.String())
	fmt.Fprintln(out, "\nwrote", filepath.Join(o.out, boundTableFile))
	return nil
}
