package gpushare

import (
	"context"
	"slices"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// fitPreFilterKey is where NodeResourcesFit's PreFilter leaves the pod's
// requests for its Filter ("PreFilter" + its name, as kube-scheduler's
// plugins key their state).
const fitPreFilterKey fwk.StateKey = "PreFilter" + noderesources.Name

// fitView keeps GPUShare's resources out of what NodeResourcesFit's Filter
// checks. Nodes do not advertise the per-card ones — memory, memory percent,
// compute — so every profile lists them in NodeResourcesFit's
// ignoredResources; but NodeResourcesFit matches each extended resource of
// the pod against a regular expression (and asks whether DRA backs it)
// before consulting that list, on every node for every pod, and for a
// shared-card pod that was the largest cost Tessera added to scheduling
// (docs/performance.md). So GPUShare's PreFilter, which runs after
// NodeResourcesFit's, replaces NodeResourcesFit's state with the one
// NodeResourcesFit computes for the pod without GPUShare's resources. The
// card count (GPU) goes too, and GPUShare's Filter checks it instead against
// what the node's device plugin advertises (cardCount), as NodeResourcesFit
// would have: the same comparison without the per-node name matching. Where
// NodeResourcesFit is disabled or runs after GPUShare, nothing is replaced:
// ignoredResources does the same work and NodeResourcesFit checks the count.
type fitView struct {
	fit   fwk.PreFilterPlugin
	names [4]v1.ResourceName
	// cards is the card-count resource, checked by GPUShare once narrowed.
	cards v1.ResourceName
	// insufficient is NodeResourcesFit's reason for too few cards.
	insufficient string
}

// newFitView builds the NodeResourcesFit instance that computes the narrowed
// state; its args do not matter to PreFilter beyond passing validation.
func newFitView(ctx context.Context, h fwk.Handle, names gpuinfo.ResourceNames) (*fitView, error) {
	args := &schedconfig.NodeResourcesFitArgs{ScoringStrategy: &schedconfig.ScoringStrategy{
		Type:      schedconfig.LeastAllocated,
		Resources: []schedconfig.ResourceSpec{{Name: string(v1.ResourceCPU), Weight: 1}},
	}}
	pl, err := noderesources.NewFit(ctx, args, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, err
	}
	return &fitView{
		fit:          pl.(fwk.PreFilterPlugin),
		names:        [4]v1.ResourceName{names.GPU, names.Memory, names.MemoryPercent, names.Cores},
		cards:        names.GPU,
		insufficient: "Insufficient " + string(names.GPU),
	}, nil
}

// narrow replaces NodeResourcesFit's PreFilter state with the pod's requests
// less GPUShare's resources, when NodeResourcesFit has written its state in
// this cycle and the pod asks for any of them. It returns how many cards (the
// card-count resource, as kube-scheduler sums a pod's requests) GPUShare's
// Filter must then check against each node's allocatable: 0 when nothing was
// replaced and NodeResourcesFit checks the count itself.
func (v *fitView) narrow(ctx context.Context, state fwk.CycleState, pod *v1.Pod) int64 {
	if _, err := state.Read(fitPreFilterKey); err != nil {
		return 0
	}
	narrowed := v.without(pod)
	if narrowed == nil {
		return 0
	}
	_, _ = v.fit.PreFilter(ctx, state, narrowed, nil)
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	if q, ok := requests[v.cards]; ok {
		return q.Value()
	}
	return 0
}

// cardCount checks the card count in NodeResourcesFit's stead (narrow): the
// pod's cards against what the node advertises less what its pods request,
// with NodeResourcesFit's reason and codes — Unschedulable where removing
// pods could make room, UnschedulableAndUnresolvable where the node
// advertises fewer cards than the pod asks for. A node that does not
// advertise the count at all (its agent runs without the device plugin) is
// not checked, as kubelet admits pods there without counting it.
func (v *fitView) cardCount(cards int64, nodeInfo fwk.NodeInfo) *fwk.Status {
	allocatable, advertised := nodeInfo.GetAllocatable().GetScalarResources()[v.cards]
	if !advertised || cards <= allocatable-nodeInfo.GetRequested().GetScalarResources()[v.cards] {
		return nil
	}
	if cards > allocatable {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, v.insufficient)
	}
	return fwk.NewStatus(fwk.Unschedulable, v.insufficient)
}

// without returns a copy of the pod whose containers ask for none of
// GPUShare's resources, or nil when none does. Everything else is shared.
func (v *fitView) without(pod *v1.Pod) *v1.Pod {
	if !slices.ContainsFunc(pod.Spec.Containers, v.asks) && !slices.ContainsFunc(pod.Spec.InitContainers, v.asks) {
		return nil
	}
	out := *pod
	out.Spec.Containers = v.strip(pod.Spec.Containers)
	out.Spec.InitContainers = v.strip(pod.Spec.InitContainers)
	return &out
}

// asks reports whether the container requests or limits one of GPUShare's
// resources.
func (v *fitView) asks(c v1.Container) bool {
	for _, name := range v.names {
		if _, ok := c.Resources.Requests[name]; ok {
			return true
		}
		if _, ok := c.Resources.Limits[name]; ok {
			return true
		}
	}
	return false
}

// strip copies containers, dropping GPUShare's resources from those that ask
// for them.
func (v *fitView) strip(containers []v1.Container) []v1.Container {
	if len(containers) == 0 {
		return containers
	}
	out := slices.Clone(containers)
	for i := range out {
		if v.asks(out[i]) {
			out[i].Resources.Requests = v.dropFrom(out[i].Resources.Requests)
			out[i].Resources.Limits = v.dropFrom(out[i].Resources.Limits)
		}
	}
	return out
}

func (v *fitView) dropFrom(list v1.ResourceList) v1.ResourceList {
	out := make(v1.ResourceList, len(list))
	for name, q := range list {
		if !slices.Contains(v.names[:], name) {
			out[name] = q
		}
	}
	return out
}
