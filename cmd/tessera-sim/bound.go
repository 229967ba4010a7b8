package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/simreport"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// boundTableFile is --bound's table.
const boundTableFile = "bound.md"

// runBound computes, for every task list and seed, the distance to the
// best packing at arrived = 100 %: the lower bound on unallocated GPU
// (sim.AllocationBound) and what the offline packer leaves unallocated
// (sim.OfflinePack), and writes the means per list.
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
	fmt.Fprintf(&b, "Unallocated GPU %% at arrived workload = 100 %% of capacity: the lower bound (sim.AllocationBound) and the offline packer's result (sim.OfflinePack); means over seeds %s.\n\n", o.seeds)
	b.WriteString("| task list | bound on unallocated % | min–max | offline packer unallocated % | min–max | best start (CPU balance weight × seeds) | seconds |\n|---|---|---|---|---|---|---|\n")
	for _, w := range workloads {
		tasks, err := readFile(filepath.Join(o.traces, simreport.TracePrefix+w+".csv"), trace.ReadTasks)
		if err != nil {
			return err
		}
		start := time.Now()
		var bound, offline overSeeds
		balances := map[float64]int{}
		for _, s := range seeds {
			arrivals := sim.Arrivals(tasks, capacity, s)
			allocation, err := sim.AllocationBound(nodes, arrivals, 100)
			if err != nil {
				return fmt.Errorf("%s, seed %d: %w", w, s, err)
			}
			bound.add(100 - allocation)
			packed, err := sim.OfflinePack(nodes, arrivals, 100)
			if err != nil {
				return fmt.Errorf("%s, seed %d: %w", w, s, err)
			}
			offline.add(100 - packed.Allocation)
			balances[packed.Balance]++
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.1f |\n", w, bound, offline, balanceCounts(balances), time.Since(start).Seconds())
	}
	if err := os.WriteFile(filepath.Join(o.out, boundTableFile), []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprint(out, b.String())
	fmt.Fprintln(out, "\nwrote", filepath.Join(o.out, boundTableFile))
	return nil
}

// overSeeds is the mean and range of a figure over seeds.
type overSeeds struct {
	sum, lo, hi float64
	n           int
}

func (s *overSeeds) add(v float64) {
	if s.n == 0 || v < s.lo {
		s.lo = v
	}
	if s.n == 0 || v > s.hi {
		s.hi = v
	}
	s.sum += v
	s.n++
}

// String is the mean and the range as two table cells.
func (s overSeeds) String() string {
	return fmt.Sprintf("%.2f | %.2f–%.2f", s.sum/float64(max(s.n, 1)), s.lo, s.hi)
}

// balanceCounts lists the offline packer's best starts over the seeds, as
// weight×seeds, by weight.
func balanceCounts(counts map[float64]int) string {
	weights := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(weights))
	for i, w := range weights {
		parts[i] = fmt.Sprintf("%g×%d", w, counts[w])
	}
	return strings.Join(parts, ", ")
}
