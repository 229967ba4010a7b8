package gpushare

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// stateKey is where PreFilter leaves the pod's parsed request.
const stateKey fwk.StateKey = Name

// cycleState is the plugin's per-cycle data: the pod's request, parsed once,
// adjustments made by AddPod/RemovePod for nominated pods and preemption dry
// runs, and the assignment chosen in Reserve.
type cycleState struct {
	req      *gpuinfo.PodRequest
	order    []gpuinfo.NamedContainer
	selector string
	// reservations keep cards from the pod (nil for most pods).
	reservations []*reservation
	// deltas adjusts the ledger per node; nil unless AddPod/RemovePod ran.
	deltas map[string][]allocator.Delta
	// removed holds, per node, the ledger's pods RemovePod took out of deltas
	// (preemption victims in a dry run), so that they are not taken out
	// again for being absent from the NodeInfo (absentDeltas).
	removed    map[string]sets.Set[types.UID]
	assignment *gpuinfo.Assignment
	// assignedNode is the node of assignment.
	assignedNode string
	// planned is the assignment Reserve chose last in this cycle, on
	// plannedNode; Unreserve keeps it, so that Reserve replays it.
	planned     *gpuinfo.Assignment
	plannedNode string
	// workload and cpuMilli are set by PreScore when a policy measures
	// fragmentation.
	workload *allocator.Workload
	cpuMilli int64
	// silentBefore is the cycle's cutoff for agent heartbeats, Unix
	// nanoseconds: an agent that last renewed its Lease before it is silent.
	// Taken once in PreFilter rather than per node.
	silentBefore int64
	// idleFits answers Filter and Score for idle nodes of a kind already
	// placed on in this cycle (shared with clones: it holds no per-node
	// state, and is used only where nothing adjusts the node).
	idleFits *ledger.IdleFits
	// cards is the card count Filter checks against each node's allocatable
	// in NodeResourcesFit's stead (fitView); 0 when NodeResourcesFit checks it.
	cards int64
	// cycle numbers the scheduling cycle for the score slots; 0 in clones,
	// whose Filter runs (nominated pods added, preemption dry runs) see the
	// nodes otherwise than Score will.
	cycle uint64
}

// Clone copies the per-node adjustments; the request is shared, read-only.
func (s *cycleState) Clone() fwk.StateData {
	c := *s
	c.cycle = 0
	if s.deltas != nil {
		c.deltas = make(map[string][]allocator.Delta, len(s.deltas))
		for node, d := range s.deltas {
			c.deltas[node] = append([]allocator.Delta(nil), d...)
		}
	}
	if s.removed != nil {
		c.removed = make(map[string]sets.Set[types.UID], len(s.removed))
		for node, uids := range s.removed {
			c.removed[node] = uids.Clone()
		}
	}
	return &c
}

// getState returns the pod's state, or nil when the pod asks for no GPUs.
func getState(state fwk.CycleState) *cycleState {
	v, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := v.(*cycleState)
	return s
}
