package gpushare

import (
	"errors"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// fit places the pod on the node's ledger entry for Filter and Score. The
// ledger is fed by its own informer handler, which may lag the scheduler's
// snapshot by a moment; so fit first brings the entry up to what the snapshot
// shows — the node's inventory annotation — and, where the ledger holds bound
// pods the NodeInfo does not, leaves them out (absentDeltas). Otherwise a pod
// tried in that moment would be rejected on stale data and wait for an
// unrelated event.
func (p *Plugin) fit(s *cycleState, nodeInfo fwk.NodeInfo, rec *nodeRecord, st allocator.Strategy) (allocator.Outcome, error) {
	node := nodeInfo.Node()
	deltas := s.deltas[node.Name]
	if p.mayBeStale(nodeInfo, rec) {
		deltas = append(slices.Clone(deltas), p.absentDeltas(s, nodeInfo)...)
	}
	out, err := p.ledger.FitCurrent(node, s.req, deltas, st, s.idleFits)
	if errors.Is(err, ledger.ErrStaleInventory) {
		p.onNode(node)
		out, err = p.ledger.Fit(node.Name, s.req, deltas, st)
	}
	return out, err
}

// absentDeltas takes out of the node's ledger entry the bound pods the
// NodeInfo does not hold: the NodeInfo is authoritative. They are pods a
// preemption dry run removed from its snapshot without telling the plugin —
// kube-scheduler's pod-group preemption removes its potential victims so —
// unless RemovePod already took them out. Pods the API has deleted before
// the ledger's handler heard of it are dropped from the ledger here for good.
// Assumed pods (reserved in this or an earlier cycle, not yet bound) are
// never left out: the snapshot may not show them yet.
func (p *Plugin) absentDeltas(s *cycleState, nodeInfo fwk.NodeInfo) []allocator.Delta {
	node := nodeInfo.Node().Name
	present := sets.New[types.UID]()
	for _, pi := range nodeInfo.GetPods() {
		present.Insert(pi.GetPod().UID)
	}
	var deltas []allocator.Delta
	for _, uid := range p.ledger.BoundPods(node) {
		switch {
		case !p.inStore(uid):
			p.ledger.RemovePod(uid)
		case !present.Has(uid) && !s.removed[node].Has(uid):
			deltas = append(deltas, p.ledger.PodDeltas(uid, node, -1)...)
		}
	}
	return deltas
}

// mayBeStale reports whether the ledger may still hold a pod the scheduler's
// snapshot of the node no longer has: when it records more bound GPU pods
// there than the snapshot shows. A node found consistent is not checked again
// until its snapshot changes (its generation; kept in the node's record, rec,
// which may be nil), so a full fleet costs one check per changed node, not
// one per node per pod.
func (p *Plugin) mayBeStale(nodeInfo fwk.NodeInfo, rec *nodeRecord) bool {
	generation := nodeInfo.GetGeneration()
	if rec != nil && rec.consistentAt.Load() == generation+1 {
		return false
	}
	if p.ledger.BoundCount(nodeInfo.Node().Name) > boundGPUPods(nodeInfo) {
		return true
	}
	if rec != nil {
		rec.consistentAt.Store(generation + 1)
	}
	return false
}

// boundGPUPods counts the pods the scheduler's snapshot has bound to the node
// with a GPU assignment.
func boundGPUPods(nodeInfo fwk.NodeInfo) int {
	n := 0
	for _, pi := range nodeInfo.GetPods() {
		if _, ok := pi.GetPod().Annotations[gpuinfo.AssignmentAnnotation]; ok {
			n++
		}
	}
	return n
}
