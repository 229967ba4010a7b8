package allocator

import (
	"cmp"
	"slices"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Links is a node's link matrix by card index, shared by the node's cards
// (Card.Links).
type Links struct {
	n     int
	class []gpuinfo.LinkClass
}

// NewLinks reads the inventory's links; nil when it has none.
func NewLinks(inv *gpuinfo.Inventory) *Links {
	if inv.Links == "" {
		return nil
	}
	indices := make([]int, len(inv.Cards))
	for i := range inv.Cards {
		indices[i] = inv.Cards[i].Index
	}
	return LinksBetween(indices, inv.Link)
}

// LinksBetween is the matrix of the cards of these indices, link(i, j)
// giving the class between the cards at positions i and j; nil for fewer
// than two cards or when no link is known.
func LinksBetween(indices []int, link func(i, j int) gpuinfo.LinkClass) *Links {
	n, known := 0, false
	for _, index := range indices {
		n = max(n, index+1)
	}
	l := &Links{n: n, class: make([]gpuinfo.LinkClass, n*n)}
	for i, a := range indices {
		for j, b := range indices {
			if i != j {
				c := link(i, j)
				l.class[a*n+b] = c
				known = known || c != gpuinfo.LinkUnknown
			}
		}
	}
	if !known {
		return nil
	}
	return l
}

// Between is the class of the link between the cards of indices a and b.
func (l *Links) Between(a, b int) gpuinfo.LinkClass {
	if l == nil || a >= l.n || b >= l.n {
		return gpuinfo.LinkUnknown
	}
	return l.class[a*l.n+b]
}

// noSet is the link class of an outcome that placed no multi-card
// container: above every class, so that it does not lower a minimum.
const noSet = gpuinfo.NumLinkClasses

// Sets are searched exhaustively up to this many steps of the search; past
// it the best set found so far is taken (only nodes of many cards with
// large requests get there).
const setSearchBudget = 1 << 15

// lookaheadWeight weighs, for the look-ahead, a link of each class a choice
// takes from the entirely free cards left: steeply, so that breaking one
// NVLink pair costs more than any number of PCIe ones.
func lookaheadWeight(c gpuinfo.LinkClass) int64 { return 1 << (5 * int64(c)) }

// setCandidate is a card a multi-card container could take.
type setCandidate struct {
	// card is its position in the node's cards, index its card index.
	card, index int
	// key ranks the card by the policy, higher first (reuse first).
	key int64
	// damage is what taking the card costs the cards left entirely free
	// (lookahead), and free that it is entirely free itself.
	damage int64
	free   bool
	// class numbers the candidates that are interchangeable (same key,
	// damage and freedom, and the same links to every other candidate):
	// the search takes the first of a class before the others.
	class int
}

// setSearch is the state of the search for a container's cards.
type setSearch struct {
	links    *Links
	cand     []setCandidate
	k        int
	required gpuinfo.LinkClass
	steps    int
	chosen   [gpuinfo.MaxCardsPerNode]int
	best     [gpuinfo.MaxCardsPerNode]int
	found    bool
	// The best set's worst link, link sum, key sum and damage.
	bestWorst           gpuinfo.LinkClass
	bestSum             int
	bestKey, bestDamage int64
}

// better reports whether a set with these figures beats the best so far:
// the best worst link, then the best link sum, then the policy's keys, then
// the least damage to the free cards left.
func (ss *setSearch) better(worst gpuinfo.LinkClass, sum int, key, damage int64) bool {
	switch {
	case !ss.found:
		return true
	case worst != ss.bestWorst:
		return worst > ss.bestWorst
	case sum != ss.bestSum:
		return sum > ss.bestSum
	case key != ss.bestKey:
		return key > ss.bestKey
	}
	return damage < ss.bestDamage
}

// search extends the set chosen[:depth] with candidates from start on.
func (ss *setSearch) search(depth, start int, worst gpuinfo.LinkClass, sum int, key, damage int64) {
	if depth == ss.k {
		if ss.better(worst, sum, key, damage) {
			ss.found = true
			ss.bestWorst, ss.bestSum, ss.bestKey, ss.bestDamage = worst, sum, key, damage
			copy(ss.best[:ss.k], ss.chosen[:ss.k])
		}
		return
	}
	for c := start; c <= len(ss.cand)-(ss.k-depth); c++ {
		if c > start && ss.cand[c].class == ss.cand[c-1].class {
			// Taking it rather than its twin before it makes a set like
			// one already searched.
			continue
		}
		if ss.steps++; ss.steps > setSearchBudget && ss.found {
			return
		}
		cd := &ss.cand[c]
		w, sm, dm := worst, sum, damage+cd.damage
		for _, p := range ss.chosen[:depth] {
			l := ss.links.Between(ss.cand[p].index, cd.index)
			w = min(w, l)
			sm += int(l)
			if cd.free && ss.cand[p].free {
				// The pair's link is not lost to the free cards left: it
				// leaves with them.
				dm -= 2 * lookaheadWeight(l)
			}
		}
		if w < ss.required || ss.found && w < ss.bestWorst {
			continue
		}
		// The pairs still to add are at most NVLink each.
		rest := gpuinfo.LinkPairs(ss.k) - gpuinfo.LinkPairs(depth+1)
		if ss.found && w == ss.bestWorst && sm+rest*int(gpuinfo.LinkNVLink) < ss.bestSum {
			continue
		}
		ss.chosen[depth] = c
		ss.search(depth+1, c+1, w, sm, key+cd.key, dm)
	}
}

// lookahead is what taking card i costs the cards that stay entirely free
// (s.free equal to capacity, eligible or not): the weights of its links to
// them; nothing when card i is not entirely free itself. Binpack and the
// other policies break their ties by it, so that a pod does not take the
// card that breaks the last free NVLink group when another would do.
func (s *scratch) lookahead(cards []Card, i int) int64 {
	links := cards[i].Links
	if links == nil || s.free[i] != cards[i].Capacity {
		return 0
	}
	var d int64
	for j := range cards {
		if j != i && cards[j].TakesShares() && cards[j].Slice == nil && !s.taken[j] && s.free[j] == cards[j].Capacity {
			d += lookaheadWeight(links.Between(cards[i].Index, cards[j].Index))
		}
	}
	return d
}

// nodeLinks is the links of the node whose cards these are; nil when it
// reports none.
func nodeLinks(cards []Card) *Links {
	for i := range cards {
		if cards[i].Links != nil {
			return cards[i].Links
		}
	}
	return nil
}

// placeSet gives multi-card container c the set of cards that fit it with the
// best worst link, then the best sum of links, then the best sum of the
// policy's keys, then the least look-ahead damage; every link of the set is
// at least required. Without links (required set) no set qualifies.
func (s *scratch) placeSet(cards []Card, c *gpuinfo.ContainerRequest, policy Policy, w *Workload, links *Links, required gpuinfo.LinkClass, out *gpuinfo.Assignment) (Failure, bool) {
	ss := &s.set
	ss.cand = s.cand[:0]
	for i := range cards {
		card := &cards[i]
		if !s.eligible[i] || s.taken[i] || card.Slice != nil {
			continue
		}
		nd, key, reuse, ok := s.room(card, i, c)
		if !ok {
			continue
		}
		if policy == FragmentationAware {
			key = s.fragKey(w, cards, i, nd, key)
		} else {
			key = policyKey(policy, key)
		}
		if reuse {
			// Cards the pod holds for a container not running beside this
			// one come first.
			key += 1 << 50
		}
		ss.cand = append(ss.cand, setCandidate{card: i, index: card.Index, key: key, damage: s.lookahead(cards, i), free: s.free[i] == card.Capacity})
	}
	if len(ss.cand) < c.Count {
		return s.failure(cards, c, len(ss.cand)), false
	}
	if links == nil {
		return Failure{Kind: NoTopology, Container: c, Link: required}, false
	}
	classify(ss.cand, links)
	sortCandidates(ss.cand)
	ss.links, ss.k, ss.required, ss.steps, ss.found = links, c.Count, required, 0, false
	ss.search(0, 0, noSet, 0, 0, 0)
	if !ss.found {
		return Failure{Kind: NoLinkedSet, Container: c, Link: required}, false
	}
	chosen := ss.best[:ss.k]
	for i := range chosen {
		chosen[i] = ss.cand[chosen[i]].card
	}
	slices.Sort(chosen)
	for _, i := range chosen {
		s.take(cards, i, c, out)
	}
	s.link = min(s.link, ss.bestWorst)
	s.linkSum += ss.bestSum
	s.damage += ss.bestDamage
	return Failure{}, true
}

// sortCandidates orders candidates by key, higher first, then by damage,
// lower first, then by class and position: the search meets the policy's
// choice first, and a class's members together.
func sortCandidates(cand []setCandidate) {
	slices.SortFunc(cand, func(a, b setCandidate) int {
		return cmp.Or(cmp.Compare(b.key, a.key), cmp.Compare(a.damage, b.damage), cmp.Compare(a.class, b.class), cmp.Compare(a.card, b.card))
	})
}

// classify numbers the candidates' classes of interchangeable ones: a
// candidate joins the class of the first earlier one it can replace in any
// set without changing the set's figures, else starts a class.
func classify(cand []setCandidate, links *Links) {
	for i := range cand {
		cand[i].class = i
		for j := 0; j < i; j++ {
			if cand[j].class == j && interchangeable(cand, links, i, j) {
				cand[i].class = j
				break
			}
		}
	}
}

// interchangeable reports whether candidates a and b have the same key,
// damage and freedom, and the same link to every other candidate.
func interchangeable(cand []setCandidate, links *Links, a, b int) bool {
	x, y := &cand[a], &cand[b]
	if x.key != y.key || x.damage != y.damage || x.free != y.free {
		return false
	}
	for m := range cand {
		if m != a && m != b && links.Between(x.index, cand[m].index) != links.Between(y.index, cand[m].index) {
			return false
		}
	}
	return true
}
