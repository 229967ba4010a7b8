package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// ratioBuckets is how many buckets of CPU per GPU an octave is cut into when
// tasks are grouped for the bound: a group counts the least CPU per GPU of
// its tasks, so coarser buckets loosen the bound, never break it.
const ratioBuckets = 8

// AllocationBound is an upper bound, in percent of the nodes' GPU capacity,
// on the GPU allocation any placement can reach with the tasks that have
// arrived when the arrived workload first reaches arrivedPercent of the
// capacity (as the replay's curve counts them): 100 less it bounds the
// unallocated share from below. It solves exactly, as a linear program, a
// relaxation that ignores which card a task sits on and lets tasks split:
// each kind of node (model, cards, CPU) offers its GPU and CPU in total; a
// GPU task goes only to nodes of its models (gpu_spec, matched as the
// scheduler matches tessera.io/gpu-model) with as many cards as it asks, and
// takes CPU with its GPU at the least ratio of its group (tasks grouped by
// models, card count and CPU per GPU, ratioBuckets to the octave);
// CPU-only tasks and memory are left out. Every placement the replay makes
// is feasible for the relaxation, so its allocation is at most the bound.
func AllocationBound(nodes []trace.Node, arrivals []trace.Task, arrivedPercent int) (float64, error) {
	nodes = GPUNodes(nodes)
	capacity := CapacityMilli(nodes)
	if capacity == 0 {
		return 0, fmt.Errorf("no GPU nodes")
	}
	kinds := nodeKinds(nodes)
	groups, err := taskGroups(arrived(arrivals, capacity, arrivedPercent))
	if err != nil {
		return 0, err
	}
	// Variables: the GPU of each group on each kind it may use, then a
	// slack per row. Rows: a group's GPU, a kind's GPU, a kind's CPU.
	type pair struct{ group, kind int }
	var pairs []pair
	for g := range groups {
		for k := range kinds {
			if groups[g].fits(&kinds[k]) {
				pairs = append(pairs, pair{g, k})
			}
		}
	}
	if len(pairs) == 0 {
		return 0, nil
	}
	rows := len(groups) + 2*len(kinds)
	cols := len(pairs) + rows
	a := mat.NewDense(rows, cols, nil)
	b := make([]float64, rows)
	c := make([]float64, cols)
	for i, p := range pairs {
		c[i] = -1
		a.Set(p.group, i, 1)
		a.Set(len(groups)+p.kind, i, 1)
		a.Set(len(groups)+len(kinds)+p.kind, i, groups[p.group].cpuPerGPU)
	}
	for g := range groups {
		b[g] = groups[g].gpus
	}
	for k := range kinds {
		b[len(groups)+k] = kinds[k].gpus
		b[len(groups)+len(kinds)+k] = kinds[k].cpus
	}
	basic := make([]int, rows)
	for r := range rows {
		a.Set(r, len(pairs)+r, 1)
		basic[r] = len(pairs) + r
	}
	opt, _, err := lp.Simplex(c, a, b, 1e-9, basic)
	if err != nil {
		return 0, fmt.Errorf("solving the relaxation: %w", err)
	}
	return min(max(-opt*1000*100/float64(capacity), 0), 100), nil
}

// arrived is the prefix of arrivals that has arrived when the arrived GPU
// first reaches percent of capacityMilli, the task that reaches it included.
func arrived(arrivals []trace.Task, capacityMilli int64, percent int) []trace.Task {
	var total int64
	for i, t := range arrivals {
		total += t.GPUMilliTotal()
		if total*100 >= int64(percent)*capacityMilli {
			return arrivals[:i+1]
		}
	}
	return arrivals
}

// nodeKind is the nodes of one model, card count and CPU, their GPU (in
// GPUs) and CPU (in cores) added up.
type nodeKind struct {
	model      string
	cards      int
	gpus, cpus float64
}

func nodeKinds(nodes []trace.Node) []nodeKind {
	type key struct {
		model    string
		cards    int
		cpuMilli int64
	}
	index := map[key]int{}
	var kinds []nodeKind
	for _, n := range nodes {
		k := key{strings.ToLower(n.Model), n.GPUs, n.CPUMilli}
		i, ok := index[k]
		if !ok {
			i = len(kinds)
			index[k] = i
			kinds = append(kinds, nodeKind{model: k.model, cards: n.GPUs})
		}
		kinds[i].gpus += float64(n.GPUs)
		kinds[i].cpus += float64(n.CPUMilli) / 1000
	}
	return kinds
}

// taskGroup is GPU tasks of one model selection, card count and bucket of
// CPU per GPU: their GPU added up, and the least CPU per GPU among them.
type taskGroup struct {
	selector  gpuinfo.Selector
	cards     int
	gpus      float64
	cpuPerGPU float64
}

// fits reports whether the group's tasks may run on nodes of the kind.
func (g *taskGroup) fits(k *nodeKind) bool {
	return g.cards <= k.cards && g.selector.Matches(k.model, "")
}

func taskGroups(tasks []trace.Task) ([]taskGroup, error) {
	type key struct {
		spec   string
		cards  int
		bucket int
	}
	index := map[key]int{}
	var groups []taskGroup
	for _, t := range tasks {
		gpu := float64(t.GPUMilliTotal()) / 1000
		if gpu <= 0 {
			continue
		}
		ratio := float64(t.CPUMilli) / 1000 / gpu
		bucket := math.MinInt
		if ratio > 0 {
			bucket = int(math.Floor(math.Log2(ratio) * ratioBuckets))
		}
		spec := slices.Clone(t.GPUSpec)
		slices.Sort(spec)
		k := key{strings.Join(spec, ","), t.NumGPU, bucket}
		i, ok := index[k]
		if !ok {
			sel, err := gpuinfo.ParseSelector(t.Annotations())
			if err != nil {
				return nil, fmt.Errorf("task %s: %w", t.Name, err)
			}
			i = len(groups)
			index[k] = i
			groups = append(groups, taskGroup{selector: sel, cards: t.NumGPU, cpuPerGPU: ratio})
		}
		groups[i].gpus += gpu
		groups[i].cpuPerGPU = min(groups[i].cpuPerGPU, ratio)
	}
	return groups, nil
}
