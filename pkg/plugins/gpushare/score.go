package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/helper"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// PreScore skips scoring for pods that ask for no GPUs.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if getState(state) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score is the node's GPU usage, memory and compute averaged, after the pod
// would be placed on it (0-100). NormalizeScore turns it into a preference
// for the fullest nodes (Binpack) or the emptiest (Spread), so the plugin
// composes with the other score plugins and their weights.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := getState(state)
	if s == nil {
		return 0, nil
	}
	out, err := p.fit(s, nodeInfo.Node())
	if err != nil || !out.Fits {
		return 0, nil
	}
	return out.UsedPermille * fwk.MaxNodeScore / 1000, nil
}

// ScoreExtensions returns the plugin itself, for NormalizeScore.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore scales scores to 0-100, reversed for Spread.
func (p *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	return helper.DefaultNormalizeScore(fwk.MaxNodeScore, p.nodePolicy == allocator.Spread, scores)
}
