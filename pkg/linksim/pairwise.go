package linksim

import (
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// choosePairwise is the HAMi-like baseline: on the node Binpack prefers
// (the fullest after the placement) among those with enough free cards, the
// set of free cards with the best sum of pairwise link classes, or for one
// card the free card with the least sum of links to the other free cards.
func choosePairwise(nodes []node, size int) (int, []int) {
	best, bestUsed := -1, -1.0
	var bestCards []int
	for i := range nodes {
		n := &nodes[i]
		var free []int
		for c := range n.cards {
			if n.used[c].Cores == 0 {
				free = append(free, c)
			}
		}
		if len(free) < size {
			continue
		}
		used := float64(len(n.cards)-len(free)+size) / float64(len(n.cards))
		if best >= 0 && used <= bestUsed {
			continue
		}
		link := func(a, b int) int { return int(topology.Link(n.shape, len(n.cards), a, b)) }
		best, bestUsed, bestCards = i, used, pairwiseSet(free, size, link)
	}
	return best, bestCards
}

// pairwiseSet chooses size of the free cards by the best sum of link(a, b)
// over their pairs (the first such set in index order), or for one card the
// card with the least sum of links to the other free cards.
func pairwiseSet(free []int, size int, link func(a, b int) int) []int {
	if size == 1 {
		pick, least := free[0], -1
		for _, a := range free {
			sum := 0
			for _, b := range free {
				if a != b {
					sum += link(a, b)
				}
			}
			if least < 0 || sum < least {
				pick, least = a, sum
			}
		}
		return []int{pick}
	}
	var best []int
	bestSum := -1
	chosen := make([]int, 0, size)
	var search func(start, sum int)
	search = func(start, sum int) {
		if len(chosen) == size {
			if sum > bestSum {
				bestSum, best = sum, append([]int(nil), chosen...)
			}
			return
		}
		for i := start; i <= len(free)-(size-len(chosen)); i++ {
			s := sum
			for _, c := range chosen {
				s += link(c, free[i])
			}
			chosen = append(chosen, free[i])
			search(i+1, s)
			chosen = chosen[:len(chosen)-1]
		}
	}
	search(0, 0)
	return best
}
