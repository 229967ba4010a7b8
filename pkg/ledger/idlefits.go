package ledger

import (
	"sync/atomic"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// IdleFits remembers, for one pod's scheduling cycle, how the pod fits an
// idle node (nothing charged on any card) of each kind (the same models,
// capacities and health in index order): every such node answers alike, so
// Filter places the pod once per kind instead of once per idle node. It is
// safe for the framework's parallel Filter calls; a slot two kinds share
// keeps the later one. The zero value is ready to use.
type IdleFits struct {
	slots [idleFitSlots]atomic.Pointer[idleFit]
}

// idleFitSlots bounds the kinds remembered at once; fleets have a few.
const idleFitSlots = 16

type idleFit struct {
	kind   uint32
	policy allocator.Policy
	out    allocator.Outcome
}

func (m *IdleFits) get(kind uint32, policy allocator.Policy) (allocator.Outcome, bool) {
	f := m.slots[kind%idleFitSlots].Load()
	if f == nil || f.kind != kind || f.policy != policy {
		return allocator.Outcome{}, false
	}
	return f.out, true
}

func (m *IdleFits) put(kind uint32, policy allocator.Policy, out allocator.Outcome) {
	m.slots[kind%idleFitSlots].Store(&idleFit{kind: kind, policy: policy, out: out})
}

// usesIdleFits reports whether a placement on n may be answered from (and
// kept in) idle: the node is idle and of a known kind, nothing adjusts it,
// the strategy has no per-node input (reserved cards, a workload measured
// against the node's CPU), and the request names no card UUIDs.
func (n *node) usesIdleFits(idle *IdleFits, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy) bool {
	return idle != nil && n != nil && n.idle && n.kind != 0 && n.err == nil && len(deltas) == 0 &&
		st.Reserve == 0 && st.Workload == nil && len(req.Selector.UUIDs) == 0 && len(req.Selector.ExcludeUUIDs) == 0
}
