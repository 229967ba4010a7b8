package gpushare

import (
	"context"
	"errors"
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// Filter's reasons that do not depend on the pod. Like every Filter reason,
// they name no node and no figure, so kube-scheduler counts them into one
// line per kind however many nodes give them; PostFilter's summary carries
// the details.
const (
	// reasonNoGPUs is the Filter reason for a node without an inventory.
	reasonNoGPUs = "node has no GPUs"
	// reasonInvalidInventory is the Filter reason for a node whose inventory
	// does not decode or validate.
	reasonInvalidInventory = "GPU inventory invalid"
	// reasonAgentSilent is the Filter reason for a node whose agent's
	// heartbeat is older than agentHeartbeatTimeout, or that has a GPU
	// inventory and no heartbeat Lease.
	reasonAgentSilent = "GPU agent not reporting"
	// reasonAgentUnready is the Filter reason for a node whose agent says it
	// cannot enforce assignments.
	reasonAgentUnready = "GPU agent cannot enforce GPU assignments"
	// reasonNoState is returned when Filter runs without PreFilter's state.
	reasonNoState = "GPU request was not parsed in PreFilter"
)

// Filter admits the node when it advertises enough cards (where
// NodeResourcesFit leaves that to GPUShare), its GPU agent is reporting and
// enforcing, and its healthy, selector-matching cards can hold every
// container at once. It returns every feasible node; the framework and Score
// pick among them. It does not allocate when the node fits.
func (p *Plugin) Filter(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := getState(state)
	if s == nil {
		return fwk.NewStatus(fwk.Error, reasonNoState)
	}
	if s.cards > 0 {
		if status := p.fitView.cardCount(s.cards, nodeInfo); status != nil {
			return status
		}
	}
	node := nodeInfo.Node().Name
	rec := p.records.lookup(nodeInfo.Node())
	if reason := agentBlocks(s, nodeInfo.Node(), rec); reason != "" {
		// Remembered first, then asked again: a Lease arriving in between
		// either finds the pod waiting (and activates it) or is seen here.
		p.wait(node, pod)
		if reason = agentBlocks(s, nodeInfo.Node(), p.records.get(node)); reason != "" {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reason)
		}
	}
	out, err := p.fit(s, nodeInfo, rec, allocator.Strategy{Policy: p.gpuPolicy, Reserve: reservedOn(s.reservations, nodeInfo.Node())})
	switch {
	case errors.Is(err, ledger.ErrNoInventory):
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reasonNoGPUs)
	case err != nil:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reasonInvalidInventory)
	case out.Fits:
		if rec != nil && s.cycle != 0 && p.scoresFromFilter() {
			rec.storeScore(s.cycle, p.linkedScore(out, usageScore(out)))
		}
		return nil
	case out.Failure.Kind == allocator.Reserved:
		p.wait(reservationsWaitKey, pod)
		return fwk.NewStatus(fwk.Unschedulable, reservedReason(s.reservations, nodeInfo.Node()))
	}
	return fwk.NewStatus(failureCode(out.Failure.Kind), out.Failure.Message(s.selector))
}

// agentBlocks is why the node's agent keeps GPU pods off it in the cycle
// (rec is its record, nil for none), or "": silent since the cycle's
// cut-off, no Lease on a node with an inventory, or not ready.
func agentBlocks(s *cycleState, node *v1.Node, rec *nodeRecord) string {
	switch {
	case rec != nil && rec.silentSince(s.silentBefore),
		s.silentBefore != math.MinInt64 && (rec == nil || rec.renewed.Load() == 0) && hasInventory(node):
		return reasonAgentSilent
	case rec != nil && rec.notReady.Load() != nil:
		return reasonAgentUnready
	}
	return ""
}

// failureCode tells the framework whether preempting pods could help:
// capacity shortfalls (linked cards included) can be, a missing card or
// selector mismatch cannot.
func failureCode(k allocator.FailureKind) fwk.Code {
	if k == allocator.NoCapacity || k == allocator.TooFewCards || k == allocator.NoLinkedSet {
		return fwk.Unschedulable
	}
	return fwk.UnschedulableAndUnresolvable
}
