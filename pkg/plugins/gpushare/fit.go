package gpushare

import (
	"errors"

	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// fit places the pod on the node's ledger entry for Filter and Score. The
// ledger is fed by its own informer handler, which may lag the scheduler's
// snapshot by a moment; so fit first brings the entry up to what the snapshot
// shows — the node's inventory annotation — and, when the pod does not fit
// for lack of capacity, drops pods the API no longer has before answering.
// Otherwise a pod tried in that moment would be rejected on stale data and
// wait for an unrelated event.
func (p *Plugin) fit(s *cycleState, nodeInfo fwk.NodeInfo, rec *nodeRecord, st allocator.Strategy) (allocator.Outcome, error) {
	node := nodeInfo.Node()
	deltas := s.deltas[node.Name]
	out, err := p.ledger.FitCurrent(node, s.req, deltas, st, s.idleFits)
	if errors.Is(err, ledger.ErrStaleInventory) {
		p.onNode(node)
		out, err = p.ledger.Fit(node.Name, s.req, deltas, st)
	}
	if err != nil || out.Fits || len(deltas) > 0 {
		return out, err
	}
	if k := out.Failure.Kind; (k == allocator.NoCapacity || k == allocator.TooFewCards) &&
		p.mayBeStale(nodeInfo, rec) && p.dropDeletedPods(node.Name) {
		return p.ledger.Fit(node.Name, s.req, deltas, st)
	}
	return out, err
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
