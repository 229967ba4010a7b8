package gpushare

import (
	"context"
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// PreScore prepares the scoring of a pod with Tessera claims (claimScore) and
// of a pod without GPUs (cpuOnlyScore).
// When a policy measures fragmentation it takes the learned workload once
// for the cycle.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s := getState(state)
	switch {
	case s != nil && p.usesWorkload():
		s.workload, s.cpuMilli = p.workload(), podCPUMilli(pod)
	case s != nil:
	case p.preScoreClaims(state, pod, nodes):
	default:
		c := &cpuOnlyState{cpuMilli: podCPUMilli(pod), claimNodes: p.claimNodes(nodes)}
		if p.nodePolicy == allocator.FragmentationAware {
			c.workload = p.workload()
		}
		state.Write(cpuOnlyStateKey, c)
	}
	return nil
}

// Score is, for Binpack and Spread, the node's GPU usage, memory and compute
// averaged, after the pod would be placed on it (0-100); NormalizeScore turns
// it into a preference for the fullest nodes (Binpack) or the emptiest
// (Spread), so the plugin composes with the other score plugins and their
// weights. For FragmentationAware it is how little the placement raises the
// node's fragmentation, ties going to the fuller node. A GPU pod's score
// also carries the links its placement gets and what it costs later
// multi-card pods (linkedScore), which come first (normalizeLinked).
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := getState(state)
	if s == nil {
		if c := getClaimState(state); c != nil {
			return p.claimScore(c, nodeInfo), nil
		}
		if c := getCPUOnlyState(state); c != nil {
			return p.cpuOnlyScore(c, nodeInfo), nil
		}
		return 0, nil
	}
	rec := p.records.lookup(nodeInfo.Node())
	if rec != nil && p.scoresFromFilter() {
		if score, ok := rec.loadScore(s.cycle); ok {
			return score, nil
		}
	}
	out, err := p.fit(s, nodeInfo, rec, p.strategy(s.workload, s.reservations, nodeInfo, s.cpuMilli))
	if err != nil || !out.Fits {
		return 0, nil
	}
	if p.nodePolicy == allocator.FragmentationAware {
		return p.linkedScore(out, fragmentationScore(out)), nil
	}
	return p.linkedScore(out, usageScore(out)), nil
}

// scoresFromFilter reports whether Filter's placement is also Score's, so
// that Filter keeps the score for Score (in the node's record): under Binpack and Spread
// both place with the same strategy; a policy that measures fragmentation
// scores with the learned workload, which Filter does not use.
func (p *Plugin) scoresFromFilter() bool { return !p.usesWorkload() }

// usageScore is the Binpack and Spread score of a placement: the node's
// usage after it, 0-100.
func usageScore(out allocator.Outcome) int64 {
	return out.UsedPermille * fwk.MaxNodeScore / 1000
}

// noGPUsRank is a node without usable GPUs' fragmentation-aware score for a
// pod without GPUs: above every GPU node's, as it strands no card.
const noGPUsRank = math.MaxInt64

// cpuOnlyScore scores a node for a pod that asks for no GPUs, by how little
// GPU its CPU could strand there. A node without usable GPUs strands none
// and scores highest; a node whose cards are DRA devices is a GPU node like
// any other. Otherwise, under Binpack and Spread alike, the node's
// GPU usage: a node whose cards are full strands nothing, one whose cards
// are free risks them all. Under FragmentationAware, how little the pod's
// CPU raises the node's fragmentation, ties going to the fuller node.
func (p *Plugin) cpuOnlyScore(c *cpuOnlyState, nodeInfo fwk.NodeInfo) int64 {
	st := p.strategy(c.workload, nil, nodeInfo, c.cpuMilli)
	out, err := p.ledger.FitWithoutGPU(nodeInfo.Node().Name, st)
	if n := c.claimNodes[nodeInfo.Node().Name]; err != nil && n != nil {
		out, err = allocator.PlaceWithoutGPU(n.cards, n.used, st), nil
	}
	switch {
	case err != nil && p.nodePolicy == allocator.FragmentationAware:
		return noGPUsRank
	case err != nil:
		return fwk.MaxNodeScore
	case p.nodePolicy == allocator.FragmentationAware:
		return fragmentationScore(out)
	}
	return usageScore(out)
}

// ScoreExtensions returns the plugin itself, for NormalizeScore.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore scales scores to 0-100, reversed for Spread's GPU pods, and
// ranks them for FragmentationAware. A pod without GPUs is never reversed:
// under every policy it goes where it strands the least GPU.
func (p *Plugin) NormalizeScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	normalize := rankScores
	if p.nodePolicy != allocator.FragmentationAware {
		normalize = linearNormalizer(p.nodePolicy == allocator.Spread && getCPUOnlyState(state) == nil)
	}
	if getState(state) != nil || getClaimState(state) != nil {
		normalizeLinked(scores, normalize)
	} else {
		normalize(scores)
	}
	return nil
}
