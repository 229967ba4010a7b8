package allocator

import (
	"math/bits"
	"sync"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Delta is a change to one card's usage that is not in the ledger yet, such
// as a nominated pod or a preemption victim during a dry run.
type Delta struct {
	UUID  string
	Usage Usage
}

// Outcome is the result of placing a pod on a node.
type Outcome struct {
	// Fits reports whether every container got its cards.
	Fits bool
	// Failure says why not, when Fits is false.
	Failure Failure
	// UsedPermille is the node's usage after the placement, memory and
	// compute averaged, in per mille of its capacity.
	UsedPermille int64
	// FragmentationDelta is how much the placement raises the node's
	// fragmentation with respect to the strategy's workload, in per mille
	// of a card; 0 without a workload.
	FragmentationDelta float64
	// Link is the worst link between two cards of one of the pod's
	// multi-card containers, LinkUnknown where the node reports none, and
	// above gpuinfo.LinkNVLink for a pod without multi-card containers;
	// LinkSum sums those containers' links (Outcome.LinkRank).
	Link    gpuinfo.LinkClass
	LinkSum int
	// LinkDamage weighs the links the cards taken had to the cards left
	// entirely free: what the placement costs later multi-card pods on the
	// node; 0 where the node reports no links.
	LinkDamage int64
}

// LinkRank ranks the links the placement gives the pod's multi-card
// containers, higher better: the worst link, then the sum. Every placement
// of a pod without multi-card containers ranks the same.
func (o *Outcome) LinkRank() int64 {
	if o.Link >= noSet {
		return 0
	}
	return int64(o.Link)<<12 | int64(min(o.LinkSum, 1<<12-1))
}

// scratch is Place's working memory, pooled so Place does not allocate.
type scratch struct {
	free     []Usage
	charge   []Usage
	base     []Usage
	eligible []bool
	taken    []bool
	// occupied holds, by card index, the memory slots of the card's MIG
	// slices that exist or are held; held those of the slices held
	// (occupy).
	occupied, held [gpuinfo.MaxCardsPerNode]uint32
	// sliceSpan is, by card index, where the card's slices are in the list
	// (first, end).
	sliceSpan [gpuinfo.MaxCardsPerNode][2]int
	// slices is set when the node has MIG slices: without them, none of
	// the slot bookkeeping runs.
	slices bool
	frag   fragment
	// fragBefore is the node's fragmentation before the placement.
	fragBefore float64
	// link and linkSum are the worst link and the sum of the links of the
	// sets placed (Outcome.Link, Outcome.LinkSum).
	link    gpuinfo.LinkClass
	linkSum int
	// damage is the look-ahead damage of the cards taken (Outcome.LinkDamage).
	damage int64
	// cand and set are placeSet's.
	cand [gpuinfo.MaxCardsPerNode]setCandidate
	set  setSearch
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// size makes the working memory hold n entries, allocating only when it
// has never held so many.
func (s *scratch) size(n int) {
	if cap(s.free) < n {
		s.free, s.charge, s.base = make([]Usage, n), make([]Usage, n), make([]Usage, n)
		s.eligible, s.taken = make([]bool, n), make([]bool, n)
	}
	s.free, s.charge, s.base = s.free[:n], s.charge[:n], s.base[:n]
	s.eligible, s.taken = s.eligible[:n], s.taken[:n]
}

// Place chooses cards on one node for every container of req. used is the
// ledger's usage of each card (parallel to cards) and deltas adjust it. When
// out is not nil and the pod fits, the chosen cards are added to it.
//
// Containers are placed in start order. A regular init container may reuse
// what the pod holds for containers that are not running at the same time;
// sidecars and app containers add up. Multi-card containers get distinct
// cards.
func Place(cards []Card, used []Usage, deltas []Delta, req *gpuinfo.PodRequest, st Strategy, out *gpuinfo.Assignment) Outcome {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	n := len(cards)
	s.size(n)
	matching, eligible, mig := 0, 0, 0
	s.slices = false
	wantsSlice := req.Isolation.MIG()
	for i := range cards {
		c := &cards[i]
		s.slices = s.slices || c.Slice != nil
		s.free[i] = c.Capacity.sub(used[i])
		s.charge[i], s.base[i] = Usage{}, Usage{}
		s.eligible[i] = false
		if req.Selector.Matches(c.ModelLower, c.UUIDLower) {
			if c.Slice == nil {
				matching++
			}
			switch {
			case c.serves(req, wantsSlice):
				s.eligible[i] = true
				eligible++
			case c.MIG || c.Slice != nil:
				mig++
			}
		}
	}
	for _, d := range deltas {
		if i := position(cards, d.UUID); i >= 0 {
			s.free[i] = s.free[i].sub(d.Usage)
		}
	}
	switch {
	case matching == 0:
		return Outcome{Failure: Failure{Kind: NoMatchingCard}}
	case eligible == 0 && req.Isolation.MIG():
		return Outcome{Failure: Failure{Kind: NoMIGSlice, Profile: req.MIGProfile}}
	case eligible == 0 && mig > 0:
		return Outcome{Failure: Failure{Kind: InMIGMode}}
	case eligible == 0:
		return Outcome{Failure: Failure{Kind: NoHealthyCard}}
	}
	if reserved := s.reserve(cards[:n], st.Reserve); reserved > 0 {
		if o := s.place(cards, req, st, out); o.Fits {
			return o
		}
		// Kept out by the reservation, or by the node itself?
		withAll := Place(cards, used, deltas, req, Strategy{Policy: st.Policy}, nil)
		if withAll.Fits {
			return Outcome{Failure: Failure{Kind: Reserved, Reserved: st.Reserve}}
		}
		return withAll
	}
	return s.place(cards, req, st, out)
}

// reserve takes out of the pod's reach enough of the entirely free healthy
// cards that keep entirely free stays at least keep: first those the pod
// could not use anyway, then the highest-indexed ones it could. It returns
// how many it took from the pod.
func (s *scratch) reserve(cards []Card, keep int) int {
	if keep <= 0 {
		return 0
	}
	for i := range cards {
		if cards[i].TakesShares() && s.free[i] == cards[i].Capacity && !s.eligible[i] {
			keep--
		}
	}
	taken := 0
	for i := len(cards) - 1; i >= 0 && keep > 0; i-- {
		if s.eligible[i] && cards[i].Slice == nil && s.free[i] == cards[i].Capacity {
			s.eligible[i] = false
			keep--
			taken++
		}
	}
	return taken
}

// place places every container on the eligible cards and measures the
// outcome.
func (s *scratch) place(cards []Card, req *gpuinfo.PodRequest, st Strategy, out *gpuinfo.Assignment) Outcome {
	n := len(cards)
	w := st.Workload
	if req.Isolation.MIG() {
		// The workload's shapes are shares of whole cards, which slices
		// do not serve.
		w = nil
	}
	if w != nil {
		s.frag.measure(w, cards[:n], s.free[:n], st.CPUFreeMilli)
		s.fragBefore = s.frag.value(w)
	}
	s.link, s.linkSum, s.damage = noSet, 0, 0
	policy := st.Policy
	if policy == FragmentationAware && (w == nil || len(req.Containers) > 1) {
		policy = Binpack
	}
	for ci := range req.Containers {
		c := &req.Containers[ci]
		if f, ok := s.placeContainer(cards[:n], c, policy, w, req.Topology, out); !ok {
			f.Container = c
			return Outcome{Failure: f}
		}
	}
	o := Outcome{Fits: true, UsedPermille: s.usedPermille(cards), Link: s.link, LinkSum: s.linkSum, LinkDamage: s.damage}
	if w != nil {
		for i := range cards[:n] {
			if s.charge[i] != (Usage{}) && cards[i].TakesShares() {
				s.frag.move(w, cards, i, s.free[i].add(s.charge[i]), s.free[i])
			}
		}
		s.frag.cpuFree -= st.CPUMilli
		o.FragmentationDelta = s.frag.value(w) - s.fragBefore
	}
	return o
}

// placeContainer places one container, updating free, charge and base: a
// multi-card container on a node that reports its links (or that must have
// linked cards) as a set (placeSet), every other card by card.
func (s *scratch) placeContainer(cards []Card, c *gpuinfo.ContainerRequest, policy Policy, w *Workload, required gpuinfo.LinkClass, out *gpuinfo.Assignment) (Failure, bool) {
	for i := range cards {
		s.taken[i] = false
	}
	if s.slices {
		s.occupy(cards)
	}
	links := nodeLinks(cards)
	if c.Count > 1 && (links != nil || required > gpuinfo.LinkUnknown) {
		return s.placeSet(cards, c, policy, w, links, required, out)
	}
	if c.Count > 1 {
		s.link = gpuinfo.LinkUnknown
	}
	for k := 0; k < c.Count; k++ {
		best, bestReuse, bestKey, bestDamage := -1, false, int64(0), int64(-1)
		for i := range cards {
			if !s.eligible[i] || s.taken[i] || s.slices && !s.placeable(cards, i) {
				continue
			}
			card := &cards[i]
			nd, key, reuse, ok := s.room(card, i, c)
			if !ok {
				continue
			}
			switch {
			case card.Slice != nil:
				var beaten bool
				if key, beaten = s.sliceKey(cards, i, c, policy, key, best >= 0 && reuse == bestReuse, bestKey); beaten {
					continue
				}
			case policy == FragmentationAware:
				// A card like one already ranked ranks the same, unless
				// their links differ.
				if j := sameCard(cards, s.free[:len(cards)], i); links == nil && j >= 0 && s.eligible[j] && !s.taken[j] && best >= 0 {
					continue
				}
				key = s.fragKey(w, cards, i, nd, key)
			default:
				key = policyKey(policy, key)
			}
			switch {
			case best < 0 || (reuse && !bestReuse) || (reuse == bestReuse && key > bestKey):
				best, bestReuse, bestKey, bestDamage = i, reuse, key, -1
			case reuse == bestReuse && key == bestKey && links != nil && card.Slice == nil:
				// The look-ahead breaks the tie.
				if bestDamage < 0 {
					bestDamage = s.lookahead(cards, best)
				}
				if d := s.lookahead(cards, i); d < bestDamage {
					best, bestDamage = i, d
				}
			}
		}
		if best < 0 {
			return s.failure(cards, c, k), false
		}
		if links != nil && cards[best].Slice == nil {
			if bestDamage < 0 {
				bestDamage = s.lookahead(cards, best)
			}
			s.damage += bestDamage
		}
		s.take(cards, best, c, out)
	}
	return Failure{}, true
}

// room reports whether container c fits card i (entry card): what it takes
// of the card (need), what the card would have left (leftoverPermille), and
// whether the pod already holds that much there for containers that do not
// run beside c (reuse). A regular init container's room includes those.
func (s *scratch) room(card *Card, i int, c *gpuinfo.ContainerRequest) (nd Usage, leftover int64, reuse, ok bool) {
	nd, ok = need(c, card)
	avail := s.free[i].add(s.charge[i]).sub(s.base[i])
	if !ok || !avail.covers(nd) {
		return nd, 0, false, false
	}
	return nd, leftoverPermille(avail.sub(nd), card.Capacity), s.charge[i].sub(s.base[i]).covers(nd), true
}

// policyKey ranks a whole card by the policy, higher first, from what it
// would have left (leftoverPermille): Binpack prefers the tightest fit,
// Spread the loosest.
func policyKey(policy Policy, leftover int64) int64 {
	if policy == Spread {
		return leftover
	}
	return -leftover
}

// take gives card i to container c.
func (s *scratch) take(cards []Card, i int, c *gpuinfo.ContainerRequest, out *gpuinfo.Assignment) {
	s.taken[i] = true
	card := &cards[i]
	nd, _ := need(c, card)
	s.commit(i, c.Kind, nd)
	if out != nil {
		out.Containers[c.Name] = append(out.Containers[c.Name], card.assign(c))
	}
}

// occupy computes, for each card in MIG mode, the memory slots its slices
// that exist or are held take (occupied), those its held slices take (held),
// and where its slices are in the list: right after the card (NewCards).
func (s *scratch) occupy(cards []Card) {
	s.occupied, s.held = [gpuinfo.MaxCardsPerNode]uint32{}, [gpuinfo.MaxCardsPerNode]uint32{}
	for i := range cards {
		sl := cards[i].Slice
		if sl == nil {
			s.sliceSpan[cards[i].Index] = [2]int{i + 1, i + 1}
			continue
		}
		s.sliceSpan[cards[i].Index][1] = i + 1
		held := s.free[i] != cards[i].Capacity
		if held {
			s.held[cards[i].Index] |= sl.Mask
		}
		if held || sl.Exists() {
			s.occupied[cards[i].Index] |= sl.Mask
		}
	}
}

// placeable reports whether entry i can be used at all: any card, any slice
// that exists or is held, and a slice to create whose slots no other slice
// takes.
func (s *scratch) placeable(cards []Card, i int) bool {
	sl := cards[i].Slice
	if sl == nil || sl.Exists() || s.free[i] != cards[i].Capacity {
		return true
	}
	return s.occupied[cards[i].Index]&sl.Mask == 0
}

// sliceKey ranks slice i for container c, higher first: for a slice of its
// own, the smallest that holds it; for a share, the slices already holding
// shares, then the tightest fit (Spread: the loosest, leftover being the
// fit's leftoverPermille); then a slice that exists over one to create; then
// the placement that rules out the fewest others on a dynamic card, so that
// the largest profiles stay possible; then the profile with the fewest
// compute slices; then the policy's choice of card. With against, it stops
// early, beaten, when the slice cannot rank above bestKey: the placements
// ruled out are counted only for contenders.
func (s *scratch) sliceKey(cards []Card, i int, c *gpuinfo.ContainerRequest, policy Policy, leftover int64, against bool, bestKey int64) (key int64, beaten bool) {
	card := &cards[i]
	held := s.free[i] != card.Capacity
	primary := -leftover
	switch {
	case c.Exclusive():
		primary = -card.Capacity.MemoryMiB
	case policy == Spread:
		primary = leftover
	}
	if held && !c.Exclusive() {
		primary += 1 << 21
	}
	exists := int64(0)
	if held || card.Slice.Exists() {
		exists = 1
	}
	rank := func(loss, fewer, cardKey int64) int64 {
		return (((primary*2+exists)*1024+1023-loss)*32+fewer)*4096 + cardKey + 2048
	}
	if against && rank(0, 31, 2047) <= bestKey {
		return 0, true
	}
	loss := min(s.placementLoss(cards, i), 1023)
	fewer := int64(gpuinfo.MaxMIGSlots - min(card.Slice.Slices, gpuinfo.MaxMIGSlots))
	return rank(loss, fewer, s.sliceCardKey(card, policy)), false
}

// placementLoss is how many memory slots' worth of placements (each
// placement counted by its size) taking slice i rules out on its card: 0
// for a slice that exists or is held.
func (s *scratch) placementLoss(cards []Card, i int) int64 {
	sl := cards[i].Slice
	if sl.Exists() || s.free[i] != cards[i].Capacity {
		return 0
	}
	var loss int64
	span := s.sliceSpan[cards[i].Index]
	for j := span[0]; j < span[1]; j++ {
		o := cards[j].Slice
		if j == i || o.Mask&sl.Mask == 0 || !s.placeable(cards, j) ||
			o.Exists() || s.free[j] != cards[j].Capacity {
			continue
		}
		loss += int64(bits.OnesCount32(o.Mask))
	}
	return loss
}

// sliceCardKey ranks a slice's card by how many of its memory slots held
// slices take, in per mille: Binpack prefers the fullest card, Spread the
// emptiest.
func (s *scratch) sliceCardKey(card *Card, policy Policy) int64 {
	taken := int64(bits.OnesCount32(s.held[card.Index])) * 1000 / int64(max(card.Slice.CardSlots, 1))
	if policy == Spread {
		return -taken
	}
	return taken
}

// fragKey ranks card i for a container taking nd by the node's
// fragmentation after the placement, lower first, then by the tightest fit.
func (s *scratch) fragKey(w *Workload, cards []Card, i int, nd Usage, leftover int64) int64 {
	return -int64((s.fragBefore+s.frag.delta(w, cards, i, s.free[i], s.free[i].sub(nd)))*100)*4096 - leftover
}

// commit records that a container of kind uses nd on card i: the pod's charge
// on the card becomes the larger of what it held and what runs together now.
func (s *scratch) commit(i int, kind gpuinfo.ContainerKind, nd Usage) {
	phase := s.base[i].add(nd)
	grown := Usage{MemoryMiB: max(phase.MemoryMiB, s.charge[i].MemoryMiB), Cores: max(phase.Cores, s.charge[i].Cores)}
	s.free[i] = s.free[i].sub(grown.sub(s.charge[i]))
	s.charge[i] = grown
	if kind != gpuinfo.InitContainer {
		s.base[i] = phase
	}
}

// failure describes why container c could not get its (k+1)-th card.
func (s *scratch) failure(cards []Card, c *gpuinfo.ContainerRequest, k int) Failure {
	f := Failure{Kind: NoCapacity, Fit: k}
	for i := range cards {
		if !s.eligible[i] || s.taken[i] {
			continue
		}
		f.InSlices = f.InSlices || cards[i].Slice != nil
		avail := s.free[i].add(s.charge[i]).sub(s.base[i])
		f.MostFree.MemoryMiB = max(f.MostFree.MemoryMiB, avail.MemoryMiB)
		f.MostFree.Cores = max(f.MostFree.Cores, avail.Cores)
	}
	if c.Count > 1 {
		f.Kind = TooFewCards
	}
	return f
}

func (s *scratch) usedPermille(cards []Card) int64 {
	var capMem, capCores, freeMem, freeCores int64
	for i := range cards {
		if cards[i].MIG || cards[i].Slice != nil && !cards[i].Slice.Exists() && s.free[i] == cards[i].Capacity {
			// Counted in its slices; a slice to create counts once held.
			continue
		}
		capMem += cards[i].Capacity.MemoryMiB
		capCores += cards[i].Capacity.Cores
		freeMem += max(s.free[i].MemoryMiB, 0)
		freeCores += max(s.free[i].Cores, 0)
	}
	if capMem == 0 || capCores == 0 {
		return 0
	}
	return ((capMem-freeMem)*1000/capMem + (capCores-freeCores)*1000/capCores) / 2
}

// leftoverPermille is what stays free on a card, memory and compute summed,
// each in per mille of the card's capacity.
func leftoverPermille(left, capacity Usage) int64 {
	return left.MemoryMiB*1000/capacity.MemoryMiB + left.Cores*1000/max(capacity.Cores, 1)
}

func position(cards []Card, uuid string) int {
	for i := range cards {
		if cards[i].UUID == uuid {
			return i
		}
	}
	return -1
}

// assign is the assignment entry that gives container c the card (or slice).
func (card *Card) assign(c *gpuinfo.ContainerRequest) gpuinfo.CardAssignment {
	e := gpuinfo.CardAssignment{Index: card.Index, UUID: card.UUID, MemoryMiB: c.MemoryOn(card.Capacity.MemoryMiB), Cores: c.Cores}
	if sl := card.Slice; sl != nil {
		e.UUID = sl.CardUUID
		e.MIG = &gpuinfo.MIGSlice{Profile: sl.Profile, Start: sl.Start, UUID: sl.DeviceUUID}
		if c.Exclusive() {
			e.MemoryMiB = card.Capacity.MemoryMiB
		}
	}
	return e
}

// Charge returns what a placed pod holds on each card (parallel to cards),
// from its assignment and its containers' start order. It is the same
// accounting Place uses, so a ledger rebuilt from annotations equals the one
// built by placing. Entries for cards the node no longer reports hold nothing.
func Charge(cards []Card, order []gpuinfo.NamedContainer, a *gpuinfo.Assignment) []Usage {
	charge := make([]Usage, len(cards))
	base := make([]Usage, len(cards))
	for _, nc := range order {
		entries := a.Containers[nc.Name]
		for ei := range entries {
			i := position(cards, entries[ei].Key())
			if i < 0 {
				continue
			}
			phase := base[i].add(entryCharge(&entries[ei], &cards[i]))
			charge[i] = Usage{MemoryMiB: max(phase.MemoryMiB, charge[i].MemoryMiB), Cores: max(phase.Cores, charge[i].Cores)}
			if nc.Kind != gpuinfo.InitContainer {
				base[i] = phase
			}
		}
	}
	return charge
}

// Holds reports whether a placement already chosen still fits: every card it
// charges (charge, parallel to cards, as Charge returns) is healthy and has
// that much free, after used and deltas, and a MIG slice to create has its
// slots free (the same rules as Place).
func Holds(cards []Card, used []Usage, deltas []Delta, charge []Usage) bool {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	s.size(len(cards))
	for i := range cards {
		s.free[i] = cards[i].Capacity.sub(used[i])
		for _, d := range deltas {
			if d.UUID == cards[i].UUID {
				s.free[i] = s.free[i].sub(d.Usage)
			}
		}
	}
	s.occupy(cards)
	for i := range cards {
		if charge[i] == (Usage{}) {
			continue
		}
		// A slice to create needs slots no other slice takes.
		if !cards[i].Healthy || cards[i].MIG || !s.free[i].covers(charge[i]) || !s.placeable(cards, i) {
			return false
		}
	}
	return true
}
