package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// Reserve chooses the pod's cards on the node and records them in the ledger
// as assumed, so the next pods see them taken before the pod is bound. The
// cards that pods nominated there will hold are not chosen, as Filter did
// not count them.
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := getState(state)
	if s == nil {
		return nil
	}
	st := allocator.Strategy{Policy: p.gpuPolicy}
	var nominated []allocator.Delta
	if lister := p.handle.SnapshotSharedLister(); lister != nil {
		if nodeInfo, err := lister.NodeInfos().Get(nodeName); err == nil {
			var w *allocator.Workload
			if p.gpuPolicy == allocator.FragmentationAware {
				w = p.workload()
			}
			st = p.strategy(w, s.reservations, nodeInfo, podCPUMilli(pod))
			nominated = p.nominatedOn(ctx, pod, nodeInfo)
		}
	}
	a, err := p.ledger.Reserve(pod.UID, nodeName, s.order, s.req, nominated, st)
	if err != nil {
		return fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	s.assignment, s.assignedNode = a, nodeName
	p.priorities.set(pod.UID, corev1helpers.PodPriority(pod))
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "assignment", a.Containers)
	return nil
}

// Unreserve returns exactly the cards Reserve took on nodeName, unless the
// pod has been confirmed bound meanwhile; an assignment on another node
// stays the pod's.
func (p *Plugin) Unreserve(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	s := getState(state)
	if s == nil {
		return
	}
	p.ledger.ForgetAssumed(pod.UID, nodeName)
	if !p.ledger.Holds(pod.UID) {
		p.priorities.forget(pod.UID)
	}
	if s.assignedNode == nodeName {
		s.assignment, s.assignedNode = nil, ""
	}
}
