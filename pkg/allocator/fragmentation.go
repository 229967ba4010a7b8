package allocator

import (
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// MaxShapes bounds the shapes of a Workload, which bounds the cost of
// measuring a node's fragmentation.
const MaxShapes = 64

// Shape is one kind of request a workload is made of.
type Shape struct {
	// Weight is the shape's share of the workload; a Workload's weights sum
	// to 1.
	Weight float64
	// CPUMilli is the request's CPU.
	CPUMilli int64
	// Container is the GPU request per card: Count cards, held exclusively
	// or shared.
	Container gpuinfo.ContainerRequest
	// Selector restricts the card models the request may use.
	Selector gpuinfo.Selector
}

// Workload is the mix of requests a cluster expects, as weighted shapes. It
// is read-only once built.
type Workload struct {
	Shapes []Shape
}

// Fragmentation of a node with respect to a workload is the GPU the
// workload's requests could not use there, weighted by how common each
// request is, in per mille of a card: for a request that fits the node it is
// the free part of every card too small for it; for one that does not fit
// (too little CPU, too few matching cards) it is all the node's free GPU.
// This is the measure of "Beware of Fragmentation" (Weng et al., ATC'23);
// the placement that raises it least leaves the most usable room.
//
// fragment holds, per shape, what that measure needs so that moving one card
// or the CPU changes it in O(shapes).
type fragment struct {
	shapes  int
	usable  [MaxShapes]int   // cards the shape fits on
	unused  [MaxShapes]int64 // free per mille on cards it does not fit
	total   int64            // free per mille on all cards
	cpuFree int64
}

// freePermille is the usable part of a card, the scarcer of memory and
// compute, in per mille.
func freePermille(free, capacity Usage) int64 {
	if free.MemoryMiB <= 0 || free.Cores <= 0 {
		return 0
	}
	return min(free.MemoryMiB*1000/capacity.MemoryMiB, free.Cores*1000/max(capacity.Cores, 1))
}

// shapeFits reports whether shape k takes a card with the given free usage.
func shapeFits(w *Workload, k int, card *Card, free Usage) bool {
	s := &w.Shapes[k]
	return free.covers(need(&s.Container, card))
}

// measure computes the node's fragment from the free usage of its healthy
// cards and its free CPU.
func (f *fragment) measure(w *Workload, cards []Card, free []Usage, cpuFree int64) {
	f.shapes = len(w.Shapes)
	f.total, f.cpuFree = 0, cpuFree
	for k := 0; k < f.shapes; k++ {
		f.usable[k], f.unused[k] = 0, 0
	}
	var lastModel string
	var matches [MaxShapes]bool
	for i := range cards {
		c := &cards[i]
		if !c.Healthy {
			continue
		}
		if lastModel == "" || c.ModelLower != lastModel {
			lastModel = c.ModelLower
			for k := 0; k < f.shapes; k++ {
				matches[k] = w.Shapes[k].Selector.Matches(c.ModelLower, "")
			}
		}
		fp := freePermille(free[i], c.Capacity)
		f.total += fp
		for k := 0; k < f.shapes; k++ {
			if matches[k] && shapeFits(w, k, c, free[i]) {
				f.usable[k]++
			} else {
				f.unused[k] += fp
			}
		}
	}
}

// move updates the fragment for a healthy card going from free usage before
// to after.
func (f *fragment) move(w *Workload, card *Card, before, after Usage) {
	fb, fa := freePermille(before, card.Capacity), freePermille(after, card.Capacity)
	f.total += fa - fb
	for k := 0; k < f.shapes; k++ {
		if !w.Shapes[k].Selector.Matches(card.ModelLower, "") {
			f.unused[k] += fa - fb
			continue
		}
		if shapeFits(w, k, card, before) {
			f.usable[k]--
		} else {
			f.unused[k] -= fb
		}
		if shapeFits(w, k, card, after) {
			f.usable[k]++
		} else {
			f.unused[k] += fa
		}
	}
}

// value is the node's expected fragmentation in per mille of a card.
func (f *fragment) value(w *Workload) float64 {
	var v float64
	for k := 0; k < f.shapes; k++ {
		s := &w.Shapes[k]
		if f.cpuFree < s.CPUMilli || f.usable[k] < s.Container.Count {
			v += s.Weight * float64(f.total)
			continue
		}
		v += s.Weight * float64(f.unused[k])
	}
	return v
}

// PlaceWithoutGPU is Place for a pod that asks for no GPUs: it fits
// anywhere as far as GPUs go; with a workload, the outcome's fragmentation
// delta is what taking the strategy's CPU does to the node.
func PlaceWithoutGPU(cards []Card, used []Usage, st Strategy) Outcome {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	n := len(cards)
	for i := range cards {
		s.free[i] = cards[i].Capacity.sub(used[i])
	}
	o := Outcome{Fits: true, UsedPermille: s.usedPermille(cards)}
	if w := st.Workload; w != nil {
		s.frag.measure(w, cards, s.free[:n], st.CPUFreeMilli)
		before := s.frag.value(w)
		s.frag.cpuFree -= st.CPUMilli
		o.FragmentationDelta = s.frag.value(w) - before
	}
	return o
}
