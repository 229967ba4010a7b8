package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// PreScore skips scoring for pods that ask for no GPUs, except under the
// fragmentation-aware node policy, where their CPU matters too. When a
// policy measures fragmentation it takes the learned workload once for the
// cycle.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	s := getState(state)
	switch {
	case s != nil && p.usesWorkload():
		s.workload, s.cpuMilli = p.learner.Workload(), podCPUMilli(pod)
	case s == nil && p.nodePolicy == allocator.FragmentationAware:
		state.Write(cpuOnlyStateKey, &cpuOnlyState{workload: p.learner.Workload(), cpuMilli: podCPUMilli(pod)})
	case s == nil:
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is, for Binpack and Spread, the node's GPU usage, memory and compute
// averaged, after the pod would be placed on it (0-100); NormalizeScore turns
// it into a preference for the fullest nodes (Binpack) or the emptiest
// (Spread), so the plugin composes with the other score plugins and their
// weights. For FragmentationAware it is how little the placement raises the
// node's fragmentation, ties going to the fuller node.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := getState(state)
	if s == nil {
		c := getCPUOnlyState(state)
		if c == nil {
			return 0, nil
		}
		out, err := p.ledger.FitWithoutGPU(nodeInfo.Node().Name, p.strategy(c.workload, nil, nodeInfo, c.cpuMilli))
		if err != nil {
			return 0, nil
		}
		return fragmentationScore(out), nil
	}
	if score, ok := p.scores.load(nodeInfo.Node().Name, s.cycle); ok {
		return score, nil
	}
	out, err := p.fit(s, nodeInfo, p.strategy(s.workload, s.reservations, nodeInfo, s.cpuMilli))
	if err != nil || !out.Fits {
		return 0, nil
	}
	if p.nodePolicy == allocator.FragmentationAware {
		return fragmentationScore(out), nil
	}
	return usageScore(out), nil
}

// usageScore is the Binpack and Spread score of a placement: the node's
// usage after it, 0-100. Filter's placement uses the same strategy as
// Score's for these policies (no workload), so Filter computes it and Score
// takes it from the memo.
func usageScore(out allocator.Outcome) int64 {
	return out.UsedPermille * fwk.MaxNodeScore / 1000
}

// ScoreExtensions returns the plugin itself, for NormalizeScore.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore scales scores to 0-100, reversed for Spread, and ranks them
// for FragmentationAware.
func (p *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if p.nodePolicy == allocator.FragmentationAware {
		rankScores(scores)
		return nil
	}
	return helper.DefaultNormalizeScore(fwk.MaxNodeScore, p.nodePolicy == allocator.Spread, scores)
}
