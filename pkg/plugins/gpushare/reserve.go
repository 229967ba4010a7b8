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
// as assumed, so the next pods see them taken before the pod is bound. It
// sees the node as Filter did: the cards that pods nominated there will hold
// are not chosen, and bound pods the snapshot's NodeInfo does not hold are
// not counted (absentDeltas: a pod-group preemption's dry run reserves its
// members with the potential victims removed from the snapshot only).
//
// A pod reserved again on the same node in one cycle — a pod group's members
// are reserved in a dry run, unreserved, then reserved for real — gets the
// cards it was given the first time while they still hold it: the
// fragmentation-aware policy's learned workload changes between the passes
// (the other members are observed), and a placement chosen afresh could
// leave a later member no room where the dry run had found it some.
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := getState(state)
	if s == nil {
		return nil
	}
	st := allocator.Strategy{Policy: p.gpuPolicy}
	var deltas []allocator.Delta
	if lister := p.handle.SnapshotSharedLister(); lister != nil {
		if nodeInfo, err := lister.NodeInfos().Get(nodeName); err == nil {
			var w *allocator.Workload
			if p.gpuPolicy == allocator.FragmentationAware {
				w = p.workload()
			}
			st = p.strategy(w, s.reservations, nodeInfo, podCPUMilli(pod))
			deltas = p.nominatedOn(ctx, pod, nodeInfo)
			if p.mayBeStale(nodeInfo, nil) {
				deltas = append(deltas, p.absentDeltas(s, nodeInfo)...)
			}
		}
	}
	a := s.planned
	if a == nil || s.plannedNode != nodeName || !p.ledger.ReservePlanned(pod.UID, nodeName, s.order, a, deltas) {
		var err error
		if a, err = p.ledger.Reserve(pod.UID, nodeName, s.order, s.req, deltas, st); err != nil {
			return fwk.NewStatus(fwk.Unschedulable, err.Error())
		}
	}
	s.assignment, s.assignedNode = a, nodeName
	s.planned, s.plannedNode = a, nodeName
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
