package gpushare

import (
	"cmp"
	"math/bits"
	"slices"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// A GPU pod's score carries, above the policy's score (within ±policyBound),
// the placement's damage tier at damageShift and its link rank
// (allocator.Outcome.LinkRank: the worst link between the cards of a
// multi-card container, then their sum) at rankShift, so that
// NormalizeScore ranks nodes by the best set they offer, then by how little
// the placement costs later multi-card pods, before the policy's preference.
const (
	rankShift   = 44
	damageShift = 38
	policyBound = int64(1) << (damageShift - 1)
)

// linkedScore adds to the policy's score of a GPU pod's placement its link
// rank and, unless the policy spreads, its damage tier: 63 less the bit
// length of allocator.Outcome.LinkDamage, whose weights grow by powers of
// two with the link class, so that a placement that breaks an NVLink group
// ranks below one that takes cards of poorer links or cards already in use.
func (p *Plugin) linkedScore(out allocator.Outcome, score int64) int64 {
	tier := int64(63)
	if p.nodePolicy != allocator.Spread {
		tier -= int64(bits.Len64(uint64(out.LinkDamage)))
	}
	return out.LinkRank()<<rankShift + tier<<damageShift + score
}

// splitLinks returns the link key (rank and damage tier, higher better) and
// the policy's score of a GPU pod's node score.
func splitLinks(score int64) (key, policy int64) {
	key = (score + policyBound) >> damageShift
	return key, score - key<<damageShift
}

// How far below the last node of one link key the first node of the next
// scores when the keys differ: rankGap where the link rank changes,
// damageGap where only the damage tier does.
const (
	rankGap   = 25
	damageGap = 5
)

// normalizeLinked normalizes a GPU pod's scores: by the policy's
// normalization (normalize) of the policy's scores where every node has the
// same link key, else by ranking the nodes by link key, then normalized
// policy score (rankLinked).
func normalizeLinked(scores fwk.NodeScoreList, normalize func(fwk.NodeScoreList)) {
	keys := make([]int64, len(scores))
	same := true
	for i := range scores {
		keys[i], scores[i].Score = splitLinks(scores[i].Score)
		same = same && keys[i] == keys[0]
	}
	normalize(scores)
	if !same {
		rankLinked(scores, keys)
	}
}

// rankLinked ranks the nodes by link key, then normalized score, both higher
// first: the best scores MaxNodeScore, each distinct pair a point less, and
// rankGap or damageGap points less where the key changes.
func rankLinked(scores fwk.NodeScoreList, keys []int64) {
	type pair struct{ key, policy int64 }
	pairs := make([]pair, len(scores))
	for i := range scores {
		pairs[i] = pair{keys[i], scores[i].Score}
	}
	order := slices.Clone(pairs)
	slices.SortFunc(order, func(a, b pair) int {
		if a.key != b.key {
			return cmp.Compare(b.key, a.key)
		}
		return cmp.Compare(b.policy, a.policy)
	})
	order = slices.Compact(order)
	value := make(map[pair]int64, len(order))
	score := fwk.MaxNodeScore
	for i, k := range order {
		if i > 0 {
			prev := order[i-1].key
			switch {
			case k.key>>(rankShift-damageShift) != prev>>(rankShift-damageShift):
				score -= rankGap
			case k.key != prev:
				score -= damageGap
			}
			score--
		}
		value[k] = max(score, fwk.MinNodeScore)
	}
	for i := range scores {
		scores[i].Score = value[pairs[i]]
	}
}

// linearNormalizer is kube-scheduler's default normalization, reversed for
// Spread.
func linearNormalizer(reverse bool) func(fwk.NodeScoreList) {
	return func(scores fwk.NodeScoreList) { _ = helper.DefaultNormalizeScore(fwk.MaxNodeScore, reverse, scores) }
}
