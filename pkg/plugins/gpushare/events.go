package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// EventsToRegister names the events that can make room for a GPU pod the
// plugin rejected: a pod holding GPUs going away (deleted, finished, or
// un-assumed after a failed bind), a node whose inventory appears or
// changes, and a node that advertises more cards (the count GPUShare checks
// in NodeResourcesFit's stead). Each comes with a hint that skips events
// that cannot help.
func (p *Plugin) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: p.isSchedulableAfterPodDeleted},
		// A resize rewrites a placed pod's assignment: an update the
		// framework has no narrower kind for.
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Update}, QueueingHintFn: p.isSchedulableAfterShareChanged},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAnnotation | fwk.UpdateNodeAllocatable}, QueueingHintFn: p.isSchedulableAfterNodeChange},
	}, nil
}

// isSchedulableAfterPodDeleted queues the pod when the deleted pod held cards
// on a node where the pod's GPUs may now fit. Only that node's cards changed,
// so when they still cannot hold the pod (counted as Filter counts them,
// before reservations and nominated pods, which only take room away) the
// deletion cannot help and the pod stays where it is: on a busy cluster
// every departure would otherwise send every pending GPU pod through
// another scheduling cycle. Whatever the ledger cannot answer (a pod it
// cannot parse, a node it does not know) queues the pod.
//
// Hints run in the scheduler's own event handler, right before the pod is
// moved to the active queue, while the ledger's informer handler runs on its
// own goroutine and may not have seen the event yet. So the hint applies the
// event to the ledger itself (idempotently): otherwise the retried pod could
// meet the old ledger, fail again, and wait for the next event.
func (p *Plugin) isSchedulableAfterPodDeleted(logger klog.Logger, pod *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	deleted, ok := oldObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, nil
	}
	p.onPodDelete(deleted)
	if _, held := deleted.Annotations[gpuinfo.AssignmentAnnotation]; !held && !p.requestsGPU(deleted) {
		return fwk.QueueSkip, nil
	}
	if !p.mayFitAfterDeletion(pod, deleted.Spec.NodeName) {
		logger.V(5).Info("A pod holding GPUs went away from a node that still cannot hold the pod", "pod", klog.KObj(pod), "deletedPod", klog.KObj(deleted))
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("A pod holding GPUs went away", "pod", klog.KObj(pod), "deletedPod", klog.KObj(deleted))
	return fwk.Queue, nil
}

// isSchedulableAfterShareChanged queues the pod when a resize changed the
// share a placed pod holds (a shrink frees room) on a node where the pod's
// GPUs may now fit, as isSchedulableAfterPodDeleted does for a deletion; it
// applies the change to the ledger first. Any other update of a placed pod
// (its status, most often) changes nothing GPUShare counts.
func (p *Plugin) isSchedulableAfterShareChanged(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	before, ok := oldObj.(*v1.Pod)
	after, ok2 := newObj.(*v1.Pod)
	if !ok || !ok2 {
		return fwk.Queue, nil
	}
	if before.Annotations[gpuinfo.AssignmentAnnotation] == after.Annotations[gpuinfo.AssignmentAnnotation] {
		return fwk.QueueSkip, nil
	}
	p.onPod(after)
	if !p.mayFitAfterDeletion(pod, after.Spec.NodeName) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("A placed pod's GPU share changed", "pod", klog.KObj(pod), "changedPod", klog.KObj(after))
	return fwk.Queue, nil
}

// mayFitAfterDeletion reports whether the pod's GPU request may fit the
// node's cards as the ledger has them; false only when the ledger knows the
// node and finds no card of the pod's models, too little room on them, or
// no set of them linked as the pod requires.
func (p *Plugin) mayFitAfterDeletion(pod *v1.Pod, nodeName string) bool {
	req, err := gpuinfo.ParsePodRequest(pod, p.names)
	if err != nil || req == nil || nodeName == "" {
		return true
	}
	out, err := p.ledger.Fit(nodeName, req, nil, allocator.Strategy{Policy: p.gpuPolicy})
	if err != nil || out.Fits {
		return true
	}
	switch out.Failure.Kind {
	case allocator.NoMatchingCard, allocator.NoCapacity, allocator.TooFewCards, allocator.NoLinkedSet, allocator.NoTopology:
		return false
	}
	return true
}

// isSchedulableAfterNodeChange queues the pod when a node's inventory
// appears or changes, or a node with an inventory advertises more cards. Like
// isSchedulableAfterPodDeleted, it first applies the change to the ledger.
func (p *Plugin) isSchedulableAfterNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	node, ok := newObj.(*v1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	p.onNode(node)
	raw, present := node.Annotations[gpuinfo.InventoryAnnotation]
	if !present {
		return fwk.QueueSkip, nil
	}
	old, ok := oldObj.(*v1.Node)
	if !ok || old.Annotations[gpuinfo.InventoryAnnotation] != raw {
		logger.V(5).Info("A node's GPU inventory appeared or changed", "pod", klog.KObj(pod), "node", klog.KObj(node))
		return fwk.Queue, nil
	}
	if p.cardsAdvertised(node) > p.cardsAdvertised(old) {
		logger.V(5).Info("A node advertises more GPUs", "pod", klog.KObj(pod), "node", klog.KObj(node))
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// cardsAdvertised is the node's allocatable card count, as its agent's
// device plugin advertises it to kubelet.
func (p *Plugin) cardsAdvertised(node *v1.Node) int64 {
	q := node.Status.Allocatable[p.names.GPU]
	return q.Value()
}

// requestsGPU reports whether any container names one of the GPU resources.
func (p *Plugin) requestsGPU(pod *v1.Pod) bool {
	check := func(cs []v1.Container) bool {
		for i := range cs {
			for _, rl := range []v1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for _, n := range []v1.ResourceName{p.names.GPU, p.names.Memory, p.names.MemoryPercent, p.names.Cores} {
					if _, ok := rl[n]; ok {
						return true
					}
				}
			}
		}
		return false
	}
	return check(pod.Spec.InitContainers) || check(pod.Spec.Containers)
}
