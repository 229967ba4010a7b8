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
func (p *Plugin) fit(s *cycleState, nodeInfo fwk.NodeInfo, st allocator.Strategy) (allocator.Outcome, error) {
	node := nodeInfo.Node()
	raw, present := node.Annotations[gpuinfo.InventoryAnnotation]
	deltas := s.deltas[node.Name]
	out, err := p.ledger.FitCurrent(node.Name, raw, present, s.req, deltas, st)
	if errors.Is(err, ledger.ErrStaleInventory) {
		p.onNode(node)
		out, err = p.ledger.Fit(node.Name, s.req, deltas, st)
	}
	if err != nil || out.Fits || len(deltas) > 0 {
		return out, err
	}
	if k := out.Failure.Kind; (k == allocator.NoCapacity || k == allocator.TooFewCards) &&
		p.ledger.BoundCount(node.Name) > boundGPUPods(nodeInfo) && p.dropDeletedPods(node.Name) {
		return p.ledger.Fit(node.Name, s.req, deltas, st)
	}
	return out, err
}

// boundGPUPods counts the pods the scheduler's snapshot has bound to the node
// with a GPU assignment. When the ledger records more, the snapshot has seen
// a deletion the ledger has not: only then is the informer store consulted.
func boundGPUPods(nodeInfo fwk.NodeInfo) int {
	n := 0
	for _, pi := range nodeInfo.GetPods() {
		if _, ok := pi.GetPod().Annotations[gpuinfo.AssignmentAnnotation]; ok {
			n++
		}
	}
	return n
}
