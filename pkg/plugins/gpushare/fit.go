package gpushare

import (
	"errors"

	v1 "k8s.io/api/core/v1"

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
func (p *Plugin) fit(s *cycleState, node *v1.Node) (allocator.Outcome, error) {
	raw, present := node.Annotations[gpuinfo.InventoryAnnotation]
	deltas := s.deltas[node.Name]
	out, err := p.ledger.FitCurrent(node.Name, raw, present, s.req, deltas, p.gpuPolicy)
	if errors.Is(err, ledger.ErrStaleInventory) {
		p.onNode(node)
		out, err = p.ledger.Fit(node.Name, s.req, deltas, p.gpuPolicy)
	}
	if err != nil || out.Fits || len(deltas) > 0 {
		return out, err
	}
	if k := out.Failure.Kind; (k == allocator.NoCapacity || k == allocator.TooFewCards) && p.dropDeletedPods(node.Name) {
		return p.ledger.Fit(node.Name, s.req, deltas, p.gpuPolicy)
	}
	return out, err
}
