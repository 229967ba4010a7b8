package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/tessera-gpu/tessera/pkg/trace"
)

// Padding is how far the arrival sequence extends past the cluster's GPU
// capacity, as in the FGD artifact: tasks are resampled until their total GPU
// request is 1.3 times the capacity.
const Padding = 1.3

// MaxArrivedPercent is the last arrived-workload percentage recorded.
const MaxArrivedPercent = 130

// Arrivals is the artifact's arrival sequence for a seed: the tasks shuffled,
// then padded by sampling tasks at random (with replacement) until the total
// GPU request reaches Padding times capacityMilli. Padded copies get a
// numbered name. The same seed gives the same sequence.
func Arrivals(tasks []trace.Task, capacityMilli int64, seed uint64) []trace.Task {
	return padded(tasks, capacityMilli, seed, Padding)
}

// padded is Arrivals padded to padding times capacityMilli.
func padded(tasks []trace.Task, capacityMilli int64, seed uint64, padding float64) []trace.Task {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([]trace.Task, len(tasks))
	copy(out, tasks)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	var total int64
	for _, t := range out {
		total += t.GPUMilliTotal()
	}
	target := int64(float64(capacityMilli) * padding)
	for n := 0; total < target && len(tasks) > 0; n++ {
		t := tasks[rng.IntN(len(tasks))]
		t.Name = fmt.Sprintf("%s-r%d", t.Name, n)
		out = append(out, t)
		total += t.GPUMilliTotal()
	}
	return out
}

// CapacityMilli is the nodes' total GPU in milli-GPU.
func CapacityMilli(nodes []trace.Node) int64 {
	var c int64
	for _, n := range nodes {
		c += int64(n.GPUs) * 1000
	}
	return c
}

// GPUNodes returns the nodes that have GPUs: the artifact's protocol replays
// on GPU nodes only.
func GPUNodes(nodes []trace.Node) []trace.Node {
	var out []trace.Node
	for _, n := range nodes {
		if n.GPUs > 0 {
			out = append(out, n)
		}
	}
	return out
}

// curve records GPU allocation against arrived workload, both in percent of
// capacity, at every integer arrived percentage from 0 to MaxArrivedPercent:
// the value at p is the allocation when the arrived workload first reaches p.
type curve struct {
	capacityMilli int64
	arrivedMilli  int64
	placedMilli   int64
	next          int
	points        []float64
}

func newCurve(capacityMilli int64) *curve {
	c := &curve{capacityMilli: capacityMilli, points: make([]float64, MaxArrivedPercent+1)}
	c.record()
	return c
}

// arrive accounts for one task: placed says whether it got a node.
func (c *curve) arrive(t trace.Task, placed bool) {
	c.arrivedMilli += t.GPUMilliTotal()
	if placed {
		c.placedMilli += t.GPUMilliTotal()
	}
	c.record()
}

func (c *curve) record() {
	for c.next <= MaxArrivedPercent && c.arrivedMilli*100 >= int64(c.next)*c.capacityMilli {
		c.points[c.next] = float64(c.placedMilli) * 100 / float64(c.capacityMilli)
		c.next++
	}
}

// complete reports whether every point has been recorded.
func (c *curve) complete() bool { return c.next > MaxArrivedPercent }
