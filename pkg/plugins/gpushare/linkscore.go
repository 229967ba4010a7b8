package gpushare

import (
	"cmp"
	"slices"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// A node's score carries the link rank of the placement (allocator.Outcome's
// LinkRank: the worst link between the cards of a multi-card container, then
// their sum) above linkShift, so that NormalizeScore can rank nodes by the
// best set they offer before the policy's preference. Policy scores stay
// within ±linkBase.
const (
	linkShift = 40
	linkBase  = int64(1) << (linkShift - 1)
)

// withLinks adds the placement's link rank to the policy's score.
func withLinks(out allocator.Outcome, score int64) int64 {
	return out.LinkRank()<<linkShift + score
}

// multiCard reports whether the pod has a container asking for several
// cards, whose scores carry link ranks.
func multiCard(req *gpuinfo.PodRequest) bool {
	return slices.ContainsFunc(req.Containers, func(c gpuinfo.ContainerRequest) bool { return c.Count > 1 })
}

// splitLinks returns the link rank and the policy's score of a node's score;
// scores below linkBase (every score of a pod without multi-card containers,
// and the lowest scores a policy gives) have rank 0.
func splitLinks(score int64) (rank, policy int64) {
	if score < linkBase {
		return 0, score
	}
	rank = (score + linkBase) >> linkShift
	return rank, score - rank<<linkShift
}

// linkTierGap is how far below the last node of one link rank the first
// node of the next rank scores under a ranking normalization.
const linkTierGap = 25

// normalizeLinked normalizes the scores of a pod by link rank first, when the
// nodes offer it different ranks, then by the policy's normalized score
// (normalize). A linear normalization (ranked false) puts the nodes of the
// best rank at 50-100, those of the next at 25-50, and so on; a ranking one
// (rankScores) ranks the nodes by link rank and policy score together, one
// point apart, linkTierGap points between ranks. With one rank for all, it
// is the policy's normalization alone.
func normalizeLinked(scores fwk.NodeScoreList, normalize func(fwk.NodeScoreList), ranked bool) {
	ranks := make([]int64, len(scores))
	for i := range scores {
		ranks[i], scores[i].Score = splitLinks(scores[i].Score)
	}
	distinct := slices.Clone(ranks)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	if len(distinct) < 2 {
		normalize(scores)
		return
	}
	if ranked {
		rankLinked(scores, ranks)
		return
	}
	normalize(scores)
	for i := range scores {
		pos, _ := slices.BinarySearch(distinct, ranks[i])
		below := min(len(distinct)-1-pos, 62)
		hi, lo := fwk.MaxNodeScore>>below, fwk.MaxNodeScore>>(below+1)
		scores[i].Score = lo + scores[i].Score*(hi-lo)/fwk.MaxNodeScore
	}
}

// rankLinked ranks the nodes by link rank, then policy score, both higher
// first: the best scores MaxNodeScore, each distinct pair a point less,
// linkTierGap points less where the rank changes.
func rankLinked(scores fwk.NodeScoreList, ranks []int64) {
	type key struct{ rank, policy int64 }
	keys := make([]key, len(scores))
	for i := range scores {
		keys[i] = key{ranks[i], scores[i].Score}
	}
	order := slices.Clone(keys)
	slices.SortFunc(order, func(a, b key) int {
		if a.rank != b.rank {
			return cmp.Compare(b.rank, a.rank)
		}
		return cmp.Compare(b.policy, a.policy)
	})
	order = slices.Compact(order)
	value := make(map[key]int64, len(order))
	score := fwk.MaxNodeScore
	for i, k := range order {
		if i > 0 {
			score--
			if k.rank != order[i-1].rank {
				score -= linkTierGap
			}
		}
		value[k] = max(score, fwk.MinNodeScore)
	}
	for i := range scores {
		scores[i].Score = value[keys[i]]
	}
}

// linearNormalizer is kube-scheduler's default normalization, reversed for
// Spread.
func linearNormalizer(reverse bool) func(fwk.NodeScoreList) {
	return func(scores fwk.NodeScoreList) { _ = helper.DefaultNormalizeScore(fwk.MaxNodeScore, reverse, scores) }
}
