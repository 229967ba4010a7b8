package allocator

import (
	"math"
	"slices"

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
// fragment holds, per shape, what that measure needs so that changing one
// card or the CPU changes it in O(shapes).
type fragment struct {
	shapes  int
	usable  [MaxShapes]int   // cards the shape fits on
	unused  [MaxShapes]int64 // free per mille on cards it does not fit
	total   int64            // free per mille on all cards
	cpuFree int64
	// model and capacity are the card kind matches and needs were computed
	// for, with workload's shapes: whether each shape may use such a card and
	// what it takes of it. Nodes usually have one kind of card and a fleet a
	// few, so they are computed once per kind while the workload stays the
	// same (a Workload is read-only, and held here it is not reused).
	workload *Workload
	model    string
	capacity Usage
	matches  [MaxShapes]bool
	needs    [MaxShapes]Usage
	// takes is the GPU, in per mille of a card, one request of each shape
	// takes on cards of the kind: what stays free is more than its CPU can
	// reach when the node's CPU runs out first.
	takes [MaxShapes]int64
	// fitting has bit k set on card i when shape k fits it now.
	fitting []uint64
}

// freePermille is the usable part of a card, the scarcer of memory and
// compute, in per mille.
func freePermille(free, capacity Usage) int64 {
	if free.MemoryMiB <= 0 || free.Cores <= 0 {
		return 0
	}
	return min(free.MemoryMiB*1000/capacity.MemoryMiB, free.Cores*1000/max(capacity.Cores, 1))
}

// matchCard makes matches and needs hold for the card's kind.
func (f *fragment) matchCard(w *Workload, card *Card) {
	if f.model == card.ModelLower && f.capacity == card.Capacity && f.model != "" {
		return
	}
	f.model, f.capacity = card.ModelLower, card.Capacity
	for k := 0; k < f.shapes; k++ {
		f.matches[k] = w.Shapes[k].Selector.Matches(card.ModelLower, "")
		nd, ok := need(&w.Shapes[k].Container, card)
		f.matches[k] = f.matches[k] && ok
		f.needs[k] = nd
		f.takes[k] = int64(w.Shapes[k].Container.Count) * (1000 - freePermille(card.Capacity.sub(nd), card.Capacity))
	}
}

// fits reports whether shape k may use a card of the current kind and has
// room in free.
func (f *fragment) fits(k int, free Usage) bool {
	return f.matches[k] && free.covers(f.needs[k])
}

// measure computes the node's fragment from the free usage of its healthy
// cards and its free CPU.
func (f *fragment) measure(w *Workload, cards []Card, free []Usage, cpuFree int64) {
	f.shapes = len(w.Shapes)
	f.total, f.cpuFree = 0, cpuFree
	if cap(f.fitting) < len(cards) {
		f.fitting = make([]uint64, len(cards))
	}
	f.fitting = f.fitting[:len(cards)]
	if f.workload != w {
		f.workload, f.model = w, ""
	}
	for k := 0; k < f.shapes; k++ {
		f.usable[k], f.unused[k] = 0, 0
	}
	for i := range cards {
		c := &cards[i]
		f.fitting[i] = 0
		if !c.TakesShares() {
			continue
		}
		fp := freePermille(free[i], c.Capacity)
		f.total += fp
		if j := sameCard(cards, free, i); j >= 0 {
			f.fitting[i] = f.fitting[j]
		} else {
			f.matchCard(w, c)
			for k := 0; k < f.shapes; k++ {
				if f.fits(k, free[i]) {
					f.fitting[i] |= 1 << k
				}
			}
		}
		for k := 0; k < f.shapes; k++ {
			if f.fitting[i]&(1<<k) != 0 {
				f.usable[k]++
			} else {
				f.unused[k] += fp
			}
		}
	}
}

// sameCard returns an earlier healthy card of the same kind and free usage
// as card i, or -1: such cards fit the same shapes.
func sameCard(cards []Card, free []Usage, i int) int {
	for j := 0; j < i; j++ {
		if cards[j].TakesShares() && free[j] == free[i] && cards[j].Capacity == cards[i].Capacity && cards[j].ModelLower == cards[i].ModelLower {
			return j
		}
	}
	return -1
}

// shift is shape k's usable cards and unused free after healthy card i goes
// to free usage after; fb and fa are its free per mille before and after.
func (f *fragment) shift(k, i int, after Usage, fb, fa int64) (int, int64) {
	usable, unused := f.usable[k], f.unused[k]
	if f.fitting[i]&(1<<k) != 0 {
		usable--
	} else {
		unused -= fb
	}
	if f.fits(k, after) {
		usable++
	} else {
		unused += fa
	}
	return usable, unused
}

// move updates the fragment for healthy card i going from before to after.
func (f *fragment) move(w *Workload, cards []Card, i int, before, after Usage) {
	card := &cards[i]
	f.matchCard(w, card)
	fb, fa := freePermille(before, card.Capacity), freePermille(after, card.Capacity)
	for k := 0; k < f.shapes; k++ {
		f.usable[k], f.unused[k] = f.shift(k, i, after, fb, fa)
		if f.fits(k, after) {
			f.fitting[i] |= 1 << k
		} else {
			f.fitting[i] &^= 1 << k
		}
	}
	f.total += fa - fb
}

// delta is how much value would change if healthy card i went from before
// to after, without changing the fragment.
func (f *fragment) delta(w *Workload, cards []Card, i int, before, after Usage) float64 {
	card := &cards[i]
	f.matchCard(w, card)
	fb, fa := freePermille(before, card.Capacity), freePermille(after, card.Capacity)
	total := f.total + fa - fb
	var d float64
	for k := 0; k < f.shapes; k++ {
		usable, unused := f.shift(k, i, after, fb, fa)
		d += w.Shapes[k].Weight * float64(f.term(w, k, total, usable, unused)-f.term(w, k, f.total, f.usable[k], f.unused[k]))
	}
	return d
}

// term is shape k's fragment: all the free GPU when the shape does not fit
// the node, else the free GPU on cards too small for it. For a share shape
// it is also at least the free GPU beyond what as many of its requests as
// the node's free CPU holds would take: a CPU-bound node strands GPU however
// well its cards fit. Whole-card shapes keep the free-card measure, which
// keeps whole cards whole for the multi-card demand.
func (f *fragment) term(w *Workload, k int, total int64, usable int, unused int64) int64 {
	s := &w.Shapes[k]
	if f.cpuFree < s.CPUMilli || usable < s.Container.Count {
		return total
	}
	if s.CPUMilli > 0 && f.takes[k] > 0 && !s.Container.Exclusive() {
		// Compared before multiplying: free CPU may be unbounded.
		if reach := f.cpuFree / s.CPUMilli; reach < total/f.takes[k] {
			return max(unused, total-reach*f.takes[k])
		}
	}
	return unused
}

// value is the node's expected fragmentation in per mille of a card.
func (f *fragment) value(w *Workload) float64 {
	var v float64
	for k := 0; k < f.shapes; k++ {
		v += w.Shapes[k].Weight * float64(f.term(w, k, f.total, f.usable[k], f.unused[k]))
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
	s.size(n)
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

// Fragmentation measures a node for metrics: its fragmentation with respect
// to the workload (as FragmentationAware measures it, CPU left aside) and
// its free GPU, both in per mille of a card. A nil or empty workload
// fragments nothing.
func Fragmentation(w *Workload, cards []Card, used []Usage) (fragmented, free float64) {
	freeUsage := make([]Usage, len(cards))
	for i := range cards {
		freeUsage[i] = cards[i].Capacity.sub(used[i])
	}
	var f fragment
	if w == nil || len(w.Shapes) == 0 {
		f.measure(&Workload{}, cards, freeUsage, math.MaxInt64)
		return 0, float64(f.total)
	}
	f.measure(w, cards, freeUsage, math.MaxInt64)
	return f.value(w), float64(f.total)
}

// WeighByScarcity returns the workload with each model-constrained shape's
// weight multiplied by how scarce the cards it may use are — the fleet's
// usable cards over those whose model it accepts (cardsByModel: usable cards
// by lower-case model) — and the weights normalised again. A shape that
// names models is, per card it can use, that much more of the demand on
// those cards than its frequency says: counting its stranded GPU at that
// weight keeps the other requests off a scarce model while requests that can
// only run there are expected. A workload without constrained shapes, or a
// fleet without cards, is returned as it is.
func (w *Workload) WeighByScarcity(cardsByModel map[string]int) *Workload {
	total := 0
	for _, n := range cardsByModel {
		total += n
	}
	constrained := false
	for i := range w.Shapes {
		constrained = constrained || w.Shapes[i].Selector.ConstrainsModel()
	}
	if !constrained || total == 0 {
		return w
	}
	out := &Workload{Shapes: slices.Clone(w.Shapes)}
	var sum float64
	for i := range out.Shapes {
		s := &out.Shapes[i]
		if s.Selector.ConstrainsModel() {
			matching := 0
			for model, n := range cardsByModel {
				if s.Selector.Matches(model, "") {
					matching += n
				}
			}
			if matching > 0 {
				s.Weight *= float64(total) / float64(matching)
			}
		}
		sum += s.Weight
	}
	for i := range out.Shapes {
		out.Shapes[i].Weight /= sum
	}
	return out
}
