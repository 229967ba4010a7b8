package gpushare

import (
	"context"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// maxVictimWait bounds how long a preemptor is held to the node of its
// victims (awaitVictims): a victim with a long grace period (a preStop hook
// that sleeps) cannot keep it from room elsewhere for longer.
const maxVictimWait = 5 * time.Minute

// nominatedDeltas returns, on top of base, what a nominated pod will hold on
// the node: upstream's nominated-pod semantics, card by card. A pod the
// ledger places there already (a preemption victim reprieved in a dry run)
// holds its own cards. A preemptor holds the cards its own victims hold or
// held (victimBook.claimed), where it fits on them, so that another
// preemptor nominated to the node, or a pod of its priority, does not take
// them; otherwise, where it fits now, what the policy chooses; otherwise it
// is placed as it will be once its victims still terminating are gone.
// Never on the cards the other pods nominated to the node claim (unless it
// claims them too): a preemptor needing more than its victims freed must
// not take another's. The cards it will get are kept from the pods it
// outranks or equals. Nil when it cannot be placed even so.
func (p *Plugin) nominatedDeltas(ctx context.Context, nominated *v1.Pod, nodeInfo fwk.NodeInfo, base []allocator.Delta) []allocator.Delta {
	node := nodeInfo.Node()
	if d := p.ledger.PodDeltas(nominated.UID, node.Name, 1); d != nil {
		return d
	}
	req, err := gpuinfo.ParsePodRequest(nominated, p.names)
	if err != nil || req == nil {
		return nil
	}
	order := gpuinfo.ContainerOrder(nominated)
	st := allocator.Strategy{Policy: p.gpuPolicy, Reserve: reservedOn(p.reservations.against(nominated), node)}
	claimed := p.victims.claimed(nominated.UID, node.Name)
	var usable func(string) bool
	if others := p.othersClaims(nominated, node.Name); others.Len() > 0 {
		usable = func(uuid string) bool { return !others.Has(uuid) || claimed.Has(uuid) }
	}
	var freed []allocator.Delta // computed once, when first needed
	if claimed != nil {
		freed = p.withoutVictims(nominated, nodeInfo, base)
		if d, ok := p.ledger.Simulate(node.Name, order, req, freed, st, claimed.Has); ok {
			return d
		}
	}
	if d, ok := p.ledger.Simulate(node.Name, order, req, base, st, usable); ok {
		return d
	}
	if freed == nil {
		freed = p.withoutVictims(nominated, nodeInfo, base)
	}
	if len(freed) > len(base) {
		if d, ok := p.ledger.Simulate(node.Name, order, req, freed, st, usable); ok {
			return d
		}
	}
	klog.FromContext(ctx).V(4).Info("Nominated pod does not fit its node's GPUs, even without its victims", "pod", klog.KObj(nominated), "node", node.Name)
	return nil
}

// othersClaims are the cards claimed on node by the pods nominated there
// other than pod (victimBook.claimed).
func (p *Plugin) othersClaims(pod *v1.Pod, node string) sets.Set[string] {
	cards := sets.New[string]()
	for _, pi := range p.handle.NominatedPodsForNode(node) {
		if n := pi.GetPod(); n.UID != pod.UID {
			cards = cards.Union(p.victims.claimed(n.UID, node))
		}
	}
	return cards
}

// withoutVictims returns base with the cards of preemptor's victims still
// on the node freed. Its victims are read from the informer's store: the
// preemption's writes may reach it before the snapshot of the cycle right
// after.
func (p *Plugin) withoutVictims(preemptor *v1.Pod, nodeInfo fwk.NodeInfo, base []allocator.Delta) []allocator.Delta {
	freed := slices.Clone(base)
	for _, pi := range nodeInfo.GetPods() {
		if victim := p.latest(pi.GetPod()); victim != nil && p.victims.evictedFor(victim, preemptor) {
			freed = append(freed, p.ledger.PodDeltas(victim.UID, nodeInfo.Node().Name, -1)...)
		}
	}
	return freed
}

// nominatedOn returns the deltas of the pods nominated to the node that the
// framework counts against pod: those of its priority or higher, as in
// Filter, so that Reserve chooses among the cards Filter left it.
func (p *Plugin) nominatedOn(ctx context.Context, pod *v1.Pod, nodeInfo fwk.NodeInfo) []allocator.Delta {
	var deltas []allocator.Delta
	priority := corev1helpers.PodPriority(pod)
	for _, pi := range p.handle.NominatedPodsForNode(nodeInfo.Node().Name) {
		if n := pi.GetPod(); n.UID != pod.UID && corev1helpers.PodPriority(n) >= priority {
			deltas = append(deltas, p.nominatedDeltas(ctx, n, nodeInfo, deltas)...)
		}
	}
	return deltas
}

// holdUntil is when a victim stops holding its preemptor to its node: its
// deletion deadline (the deletion plus its grace period), and no later than
// maxVictimWait after the preemption.
func holdUntil(victim *v1.Pod) time.Time {
	until := victim.DeletionTimestamp.Time
	for _, c := range victim.Status.Conditions {
		if c.Type == v1.DisruptionTarget && !c.LastTransitionTime.IsZero() {
			if limit := c.LastTransitionTime.Add(maxVictimWait); limit.Before(until) {
				until = limit
			}
		}
	}
	return until
}

// awaitVictims keeps a preemptor to the node it was nominated to while its
// victims there are still terminating, up to holdUntil: otherwise room
// appearing elsewhere first would let it bind there, and its victims would
// have been evicted for nothing. Only pods the scheduler evicted for it count
// (victimBook.evictedFor), so a tenant's own pod with a long grace period
// cannot pin it, nor can another preemptor's victims. After a scheduler
// restart, which preemptor chose which victim is not known: any victim of
// lower priority on the node holds it then, as upstream's eligibility check
// has it, still no longer than holdUntil. The node is the pod's nomination,
// or where the book has its victims: the nomination's status update can
// reach the scheduling queue after the pod's next cycle has begun, and that
// cycle, seeing no nomination, would otherwise look everywhere and preempt
// again elsewhere while its first victims still terminate.
func (p *Plugin) awaitVictims(pod *v1.Pod, now time.Time) *fwk.PreFilterResult {
	nominated := pod.Status.NominatedNodeName
	if nominated == "" {
		nominated = p.victims.claimNode(pod.UID)
	}
	lister := p.handle.SnapshotSharedLister()
	if nominated == "" || lister == nil {
		return nil
	}
	nodeInfo, err := lister.NodeInfos().Get(nominated)
	if err != nil {
		return nil
	}
	for _, pi := range nodeInfo.GetPods() {
		if victim := p.latest(pi.GetPod()); victim != nil && p.victims.evictedFor(victim, pod) && now.Before(holdUntil(victim)) {
			return &fwk.PreFilterResult{NodeNames: sets.New(nominated)}
		}
	}
	return nil
}

// preferVictimsNode tries first, for a preemptor whose pod object does not
// show its nomination yet, the node its victims were evicted from, as
// kube-scheduler tries a nominated node first: where the pod's GPUs fit
// there now (beside the pods nominated there), only that node. Without it,
// a cycle running before the nomination reached the pod object chose among
// all nodes by score and could bind elsewhere, its victims evicted for
// nothing. Nil where it does not fit there, or the pod has no victims.
func (p *Plugin) preferVictimsNode(ctx context.Context, pod *v1.Pod, s *cycleState) *fwk.PreFilterResult {
	if pod.Status.NominatedNodeName != "" {
		return nil
	}
	node := p.victims.claimNode(pod.UID)
	lister := p.handle.SnapshotSharedLister()
	if node == "" || lister == nil {
		return nil
	}
	nodeInfo, err := lister.NodeInfos().Get(node)
	if err != nil || nodeInfo.Node() == nil {
		return nil
	}
	trial := s.Clone().(*cycleState)
	trial.addDeltas(node, p.nominatedOn(ctx, pod, nodeInfo))
	out, err := p.fit(trial, nodeInfo, p.records.lookup(nodeInfo.Node()), allocator.Strategy{Policy: p.gpuPolicy, Reserve: reservedOn(s.reservations, nodeInfo.Node())})
	if err != nil || !out.Fits {
		return nil
	}
	return &fwk.PreFilterResult{NodeNames: sets.New(node)}
}
