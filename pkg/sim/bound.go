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

// ratioBuckets is how many buckets of CPU per GPU an octave is cut into
// when tasks are grouped for the bound: a group counts the least CPU per
// GPU of its tasks, so coarser buckets loosen the bound, never break it.
const ratioBuckets = 8

// hostResources is how many host resources the relaxation counts: CPU (in
// cores). Replayed pods ask no host memory (the artifact fits tasks on CPU
// and GPU only), so the relaxation counts none either: counted, it could
// fall below what a replay allocates.
const hostResources = 1

// host is an amount of each host resource.
type host [hostResources]float64

func hostOf(cpuMilli int64) host {
	return host{float64(cpuMilli) / 1000}
}

// AllocationBound is an upper bound, in percent of the nodes' GPU capacity,
// on the GPU allocation any placement can reach with the tasks that have
// arrived when the arrived workload first reaches arrivedPercent of the
// capacity (as the replay's curve counts them): 100 less it bounds the
// unallocated share from below. It is the lesser of two relaxations, each
// solved exactly as a linear program. The first ignores which card a task
// sits on and lets tasks split:
// each kind of node (model, cards, CPU) offers its GPU and CPU in total; a
// GPU task goes only to nodes of its models (gpu_spec, matched as the
// scheduler matches tessera.io/gpu-model) with as many cards as it asks,
// and takes CPU with its GPU at the least ratio of its group (tasks grouped
// by models, card count and CPU per GPU, ratioBuckets to the octave);
// CPU-only tasks are left out. The
// second keeps tasks whole on cards and ignores everything else
// (cardBound). Every placement the replay makes is feasible for both, so
// its allocation is at most the bound.
func AllocationBound(nodes []trace.Node, arrivals []trace.Task, arrivedPercent int) (float64, error) {
	nodes = GPUNodes(nodes)
	capacity := CapacityMilli(nodes)
	if capacity == 0 {
		return 0, fmt.Errorf("no GPU nodes")
	}
	tasks := arrived(arrivals, capacity, arrivedPercent)
	groups, err := taskGroups(tasks)
	if err != nil {
		return 0, err
	}
	gpus, err := solveRelaxation(nodeKinds(nodes), groups)
	if err != nil {
		return 0, err
	}
	onCards, err := cardBound(tasks, int(capacity/1000))
	if err != nil {
		return 0, err
	}
	gpus = min(gpus, onCards)
	return min(max(gpus*1000*100/float64(capacity), 0), 100), nil
}

// solveRelaxation returns the most GPU the relaxation places, solved as a
// linear program (gonum's simplex). Variables: the GPU of each group on
// each kind it may use, then a slack per row. Rows: a group's GPU, a kind's
// GPU, a kind's CPU.
func solveRelaxation(kinds []nodeKind, groups []taskGroup) (float64, error) {
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
	kindRow := func(resource, kind int) int { return len(groups) + resource*len(kinds) + kind }
	rows := len(groups) + (1+hostResources)*len(kinds)
	cols := len(pairs) + rows
	a := mat.NewDense(rows, cols, nil)
	b := make([]float64, rows)
	gain := make([]float64, cols)
	for i, p := range pairs {
		gain[i] = 1
		a.Set(p.group, i, 1)
		a.Set(kindRow(0, p.kind), i, 1)
		for res := range hostResources {
			a.Set(kindRow(1+res, p.kind), i, groups[p.group].leastPerGPU[res])
		}
	}
	for g := range groups {
		b[g] = groups[g].gpus
	}
	for k := range kinds {
		b[kindRow(0, k)] = kinds[k].gpus
		for res := range hostResources {
			b[kindRow(1+res, k)] = kinds[k].offers[res]
		}
	}
	gpus, err := maximize(gain, a, b, len(pairs))
	if err != nil {
		return 0, fmt.Errorf("solving the relaxation: %w", err)
	}
	return gpus, nil
}

// maximize solves max gainᵀx subject to a·x ≤ b, x ≥ 0, for the first vars
// columns of a, with gonum's simplex: it fills the columns after them with
// a slack per row (a has vars+rows columns, gain as many entries, the
// slacks' zero), which is the feasible basis the simplex starts from.
func maximize(gain []float64, a *mat.Dense, b []float64, vars int) (float64, error) {
	rows, _ := a.Dims()
	c := make([]float64, len(gain))
	for i, g := range gain {
		c[i] = -g
	}
	basic := make([]int, rows)
	for row := range rows {
		a.Set(row, vars+row, 1)
		basic[row] = vars + row
	}
	opt, _, err := lp.Simplex(c, a, b, 1e-9, basic)
	return -opt, err
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

// nodeKind is the nodes of one model, card count and CPU: their GPU (in
// GPUs) and CPU added up.
type nodeKind struct {
	model  string
	cards  int
	gpus   float64
	offers host
}

// kindKey identifies a node's kind.
type kindKey struct {
	model    string
	cards    int
	cpuMilli int64
}

func nodeKinds(nodes []trace.Node) []nodeKind {
	index := map[kindKey]int{}
	var kinds []nodeKind
	for _, n := range nodes {
		k := kindKey{strings.ToLower(n.Model), n.GPUs, n.CPUMilli}
		i, ok := index[k]
		if !ok {
			i = len(kinds)
			index[k] = i
			kinds = append(kinds, nodeKind{model: k.model, cards: n.GPUs})
		}
		kinds[i].gpus += float64(n.GPUs)
		offers := hostOf(n.CPUMilli)
		for res := range hostResources {
			kinds[i].offers[res] += offers[res]
		}
	}
	return kinds
}

// taskGroup is GPU tasks of one model selection, card count and bucket of
// CPU per GPU: their GPU added up, and the least CPU per GPU among them.
type taskGroup struct {
	selector    gpuinfo.Selector
	cards       int
	gpus        float64
	leastPerGPU host
}

// fits reports whether the group's tasks may run on nodes of the kind.
func (g *taskGroup) fits(k *nodeKind) bool {
	return g.cards <= k.cards && g.selector.Matches(k.model, "")
}

// ratioBucket is the bucket of a ratio, ratioBuckets to the octave.
func ratioBucket(ratio float64) int {
	if ratio <= 0 {
		return math.MinInt
	}
	return int(math.Floor(math.Log2(ratio) * ratioBuckets))
}

// taskGroups groups the GPU tasks.
func taskGroups(tasks []trace.Task) ([]taskGroup, error) {
	type key struct {
		spec    string
		cards   int
		buckets [hostResources]int
	}
	index := map[key]int{}
	var groups []taskGroup
	for _, t := range tasks {
		gpu := float64(t.GPUMilliTotal()) / 1000
		if gpu <= 0 {
			continue
		}
		uses := hostOf(t.CPUMilli)
		spec := slices.Clone(t.GPUSpec)
		slices.Sort(spec)
		k := key{spec: strings.Join(spec, ","), cards: t.NumGPU}
		var ratio host
		for res := range hostResources {
			ratio[res] = uses[res] / gpu
			k.buckets[res] = ratioBucket(ratio[res])
		}
		i, ok := index[k]
		if !ok {
			sel, err := gpuinfo.ParseSelector(t.Annotations())
			if err != nil {
				return nil, fmt.Errorf("task %s: %w", t.Name, err)
			}
			i = len(groups)
			index[k] = i
			groups = append(groups, taskGroup{selector: sel, cards: t.NumGPU, leastPerGPU: ratio})
		}
		g := &groups[i]
		g.gpus += gpu
		for res := range hostResources {
			g.leastPerGPU[res] = min(g.leastPerGPU[res], ratio[res])
		}
	}
	return groups, nil
}
