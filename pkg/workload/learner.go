// Package workload learns, online, the mix of GPU requests a cluster sees:
// a decayed histogram of request shapes (cards, share of each card, CPU,
// model constraint), published as the allocator.Workload that the
// fragmentation-aware policy measures nodes against. Unlike FGD, which is
// given the workload's distribution in advance, it starts from a prior and
// follows the requests as they arrive, forgetting old ones with a half-life.
package workload

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// DefaultHalfLife is how many observed requests it takes for an observation's
// weight to halve: long enough to hold a steady mix, short enough to follow a
// shift within a day of a busy cluster's pods.
const DefaultHalfLife = 20000

// priorObservations is how many requests the prior is worth: it shapes the
// first decisions and is outweighed within a few dozen pods.
const priorObservations = 10

// cpuStepMilli groups CPU requests in steps, so that similar requests share
// a bin; the bin's CPU is their weighted mean.
const cpuStepMilli = 250

// maxBins bounds the histogram; the lightest bins are dropped beyond it.
const maxBins = 8 * allocator.MaxShapes

// Prior is the workload assumed before any request is seen: mostly one whole
// card or a half or quarter share, some multi-card jobs.
var Prior = []allocator.Shape{
	{Weight: 0.30, CPUMilli: 8000, Container: whole(1)},
	{Weight: 0.05, CPUMilli: 16000, Container: whole(2)},
	{Weight: 0.05, CPUMilli: 32000, Container: whole(4)},
	{Weight: 0.05, CPUMilli: 64000, Container: whole(8)},
	{Weight: 0.20, CPUMilli: 4000, Container: share(50)},
	{Weight: 0.20, CPUMilli: 4000, Container: share(25)},
	{Weight: 0.15, CPUMilli: 2000, Container: share(10)},
}

func whole(n int) gpuinfo.ContainerRequest {
	return gpuinfo.ContainerRequest{Count: n, Cores: gpuinfo.FullCores}
}

func share(percent int64) gpuinfo.ContainerRequest {
	return gpuinfo.ContainerRequest{Count: 1, Cores: percent, MemoryPercent: percent}
}

// Learner is the decayed histogram. It is safe for concurrent use; reading
// the workload does not lock once it is built.
type Learner struct {
	mu     sync.Mutex
	bins   map[key]*bin
	growth float64 // per observation: weights grow instead of decaying
	next   float64 // weight of the next observation
	dirty  bool
	built  atomic.Pointer[allocator.Workload]
	// seen holds the ids observed and not forgotten.
	seen map[string]struct{}
}

type key struct {
	count                     int
	cores, memMiB, memPercent int64
	cpu                       int64
	models, excluded          string
}

// bin is one shape's weight; its CPU is the weighted mean of the requests
// that fell in it.
type bin struct {
	shape       allocator.Shape
	weight      float64
	cpuWeighted float64
}

// NewLearner returns a learner seeded with the prior. halfLife is in
// observations.
func NewLearner(halfLife int) *Learner {
	l := &Learner{bins: map[key]*bin{}, seen: map[string]struct{}{}, growth: math.Exp2(1 / float64(max(halfLife, 1))), next: 1}
	for _, s := range Prior {
		l.add(s, s.Weight*priorObservations)
	}
	l.rebuild()
	return l
}

// Observe records the request of the pod with the given id, once however
// often it is called for that id until Forget: its CPU and the GPU request of
// its largest container (all its exclusive cards together when it holds whole
// cards). UUID constraints are not part of a shape: they name one card.
func (l *Learner) Observe(id string, req *gpuinfo.PodRequest, cpuMilli int64) {
	if req == nil || len(req.Containers) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[id]; ok {
		return
	}
	l.seen[id] = struct{}{}
	s := allocator.Shape{CPUMilli: cpuMilli, Selector: gpuinfo.Selector{Models: req.Selector.Models, ExcludeModels: req.Selector.ExcludeModels}}
	for _, c := range req.Containers {
		switch {
		case c.Exclusive():
			if !s.Container.Exclusive() {
				s.Container = gpuinfo.ContainerRequest{Cores: gpuinfo.FullCores}
			}
			s.Container.Count += c.Count
		case !s.Container.Exclusive() && c.Cores >= s.Container.Cores:
			s.Container = gpuinfo.ContainerRequest{Count: c.Count, Cores: c.Cores, MemoryMiB: c.MemoryMiB, MemoryPercent: c.MemoryPercent}
		}
	}
	s.Container.Count = min(s.Container.Count, gpuinfo.MaxCardsPerNode)
	l.add(s, l.next)
	l.next *= l.growth
	if l.next > 1e100 {
		l.rescale()
	}
}

// Forget lets the id be observed again; call it when the pod is gone, so the
// record of observed pods stays as small as the set of live ones.
func (l *Learner) Forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.seen, id)
}

// Workload returns the current mix: the heaviest MaxShapes shapes with
// weights summing to 1.
func (l *Learner) Workload() *allocator.Workload {
	l.mu.Lock()
	if l.dirty {
		l.rebuild()
	}
	l.mu.Unlock()
	return l.built.Load()
}

func (l *Learner) add(s allocator.Shape, w float64) {
	k := key{
		count: s.Container.Count, cores: s.Container.Cores, memMiB: s.Container.MemoryMiB, memPercent: s.Container.MemoryPercent,
		cpu: roundUp(s.CPUMilli, cpuStepMilli), models: strings.Join(s.Selector.Models, ","), excluded: strings.Join(s.Selector.ExcludeModels, ","),
	}
	b := l.bins[k]
	if b == nil {
		b = &bin{shape: s}
		l.bins[k] = b
	}
	b.weight += w
	b.cpuWeighted += w * float64(s.CPUMilli)
	l.dirty = true
	if len(l.bins) > maxBins {
		l.prune()
	}
}

// referenceCardMiB converts memory asked in MiB into a share of a card for
// weighting only: the memory of a data-center card (80 GiB). Placement
// itself measures every request against each card's real memory.
const referenceCardMiB = 81920

// gpuWeight scales a shape's frequency by the square root of its GPU size
// (cards × share of each, the share being the larger of compute and memory,
// so that a memory-only request weighs what it holds): a fragment that
// strands a large request costs more allocation than one that strands a
// small one, and on the openb trace the square root protects large requests
// best (frequency alone, and size itself, both left more GPU unallocated;
// docs/performance.md). Every shape weighs something: a request holds at
// least 1 MiB.
func gpuWeight(s *allocator.Shape) float64 {
	c := &s.Container
	share := float64(min(c.Cores, gpuinfo.FullCores))
	memory := float64(c.MemoryPercent)
	if c.MemoryMiB > 0 {
		memory = float64(c.MemoryMiB) * gpuinfo.FullCores / referenceCardMiB
	}
	share = max(share, min(memory, gpuinfo.FullCores), float64(gpuinfo.FullCores)/referenceCardMiB)
	return math.Sqrt(float64(c.Count) * share)
}

// rebuild publishes the heaviest shapes, normalised.
func (l *Learner) rebuild() {
	bins := l.sorted()
	bins = bins[:min(len(bins), allocator.MaxShapes)]
	var total float64
	for _, b := range bins {
		total += b.weight * gpuWeight(&b.shape)
	}
	w := &allocator.Workload{Shapes: make([]allocator.Shape, len(bins))}
	for i, b := range bins {
		w.Shapes[i] = b.shape
		w.Shapes[i].CPUMilli = int64(math.Ceil(b.cpuWeighted / b.weight))
		w.Shapes[i].Weight = b.weight * gpuWeight(&b.shape) / total
	}
	l.built.Store(w)
	l.dirty = false
}

// prune drops the lightest half of the bins.
func (l *Learner) prune() {
	keep := map[*bin]bool{}
	for _, b := range l.sorted()[:maxBins/2] {
		keep[b] = true
	}
	for k, b := range l.bins {
		if !keep[b] {
			delete(l.bins, k)
		}
	}
}

// rescale divides every weight by the next observation's, keeping ratios.
func (l *Learner) rescale() {
	for _, b := range l.bins {
		b.weight /= l.next
		b.cpuWeighted /= l.next
	}
	l.next = 1
}

// sorted lists the bins heaviest first, in a stable order.
func (l *Learner) sorted() []*bin {
	bins := make([]*bin, 0, len(l.bins))
	for _, b := range l.bins {
		bins = append(bins, b)
	}
	slices.SortFunc(bins, func(a, b *bin) int {
		switch {
		case a.weight > b.weight:
			return -1
		case a.weight < b.weight:
			return 1
		}
		return compareShapes(&a.shape, &b.shape)
	})
	return bins
}

func compareShapes(a, b *allocator.Shape) int {
	ac, bc := &a.Container, &b.Container
	for _, d := range []int64{int64(ac.Count - bc.Count), ac.Cores - bc.Cores, ac.MemoryMiB - bc.MemoryMiB, ac.MemoryPercent - bc.MemoryPercent, a.CPUMilli - b.CPUMilli} {
		if d != 0 {
			return int(max(min(d, 1), -1))
		}
	}
	return strings.Compare(a.Selector.String(), b.Selector.String())
}

func roundUp(v, step int64) int64 { return (v + step - 1) / step * step }
