package allocator

import (
	"math"

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
	// for: whether each shape may use such a card and what it takes of it.
	// Nodes usually have one kind of card, so they are computed once.
	model    string
	capacity Usage
	matches  [MaxShapes]bool
	needs    [MaxShapes]Usage
	// fitting has bit k set on card i when shape k fits it now.
	fitting [gpuinfo.MaxCardsPerNode]uint64
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
		f.needs[k] = need(&w.Shapes[k].Container, card)
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
	f.total, f.cpuFree, f.model = 0, cpuFree, ""
	for k := 0; k < f.shapes; k++ {
		f.usable[k], f.unused[k] = 0, 0
	}
	for i := range cards {
		c := &cards[i]
		f.fitting[i] = 0
		if !c.Healthy {
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
		if cards[j].Healthy && free[j] == free[i] && cards[j].Capacity == cards[i].Capacity && cards[j].ModelLower == cards[i].ModelLower {
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
// the node, else the free GPU on cards too small for it.
func (f *fragment) term(w *Workload, k int, total int64, usable int, unused int64) int64 {
	s := &w.Shapes[k]
	if f.cpuFree < s.CPUMilli || usable < s.Container.Count {
		return total
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
