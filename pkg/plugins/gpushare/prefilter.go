package gpushare

import (
	"context"
	"math"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// PreFilter parses the pod's GPU request once and shows it to the workload
// learner. Pods without one skip the plugin; an invalid one is unschedulable
// with the validation message.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	req, err := gpuinfo.ParsePodRequest(pod, p.names)
	if err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "invalid GPU request: "+err.Error())
	}
	if req == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if !p.waitForLedger(ctx) {
		return nil, fwk.NewStatus(fwk.Error, "GPU ledger has not finished loading nodes and pods")
	}
	// The learner counts each pod once, here in the scheduling cycle, so a
	// replay is deterministic.
	p.learner.Observe(string(pod.UID), req, podCPUMilli(pod))
	cards := p.fitView.narrow(ctx, state, pod)
	state.Write(stateKey, &cycleState{req: req, order: gpuinfo.ContainerOrder(pod), selector: truncate(req.Selector.String(), maxQuoted), cards: cards,
		reservations: p.reservations.against(pod), silentBefore: p.silentBefore(), cycle: p.records.newCycle(), idleFits: &ledger.IdleFits{}})
	if res := p.awaitVictims(pod, time.Now()); res != nil {
		return res, nil
	}
	if res := p.preferVictimsNode(ctx, pod, getState(state)); res != nil {
		return res, nil
	}
	return p.prune(pod, getState(state)), nil
}

// silentBefore is the heartbeat cutoff for a cycle starting now: agents that
// last renewed before it are silent. With the check off, no agent is.
func (p *Plugin) silentBefore() int64 {
	if p.agentTimeout <= 0 {
		return math.MinInt64
	}
	return time.Now().Add(-p.agentTimeout).UnixNano()
}

// waitForLedger blocks until the ledger's informer handlers have seen every
// existing node and pod, so the first pods are not placed on a partial ledger.
func (p *Plugin) waitForLedger(ctx context.Context) bool {
	if p.synced.Load() {
		return true
	}
	syncs := make([]cache.InformerSynced, len(p.handlers))
	for i, h := range p.handlers {
		syncs[i] = h.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return false
	}
	p.synced.Store(true)
	return true
}

// PreFilterExtensions returns the plugin itself: it adjusts per-card usage
// for nominated pods and preemption victims.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod accounts for a pod the framework adds to a node hypothetically: a
// pod RemovePod took out (a preemption victim being reprieved) gets its own
// cards back; a pod the ledger counts there already needs nothing (it is
// counted while the NodeInfo holds it); a nominated pod gets the cards it
// will get (nominatedDeltas).
func (p *Plugin) AddPod(ctx context.Context, state fwk.CycleState, _ *v1.Pod, podInfoToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := getState(state)
	if s == nil {
		return nil
	}
	added := podInfoToAdd.GetPod()
	nodeName := nodeInfo.Node().Name
	if s.removed[nodeName].Has(added.UID) {
		s.removed[nodeName].Delete(added.UID)
		s.addDeltas(nodeName, p.ledger.PodDeltas(added.UID, nodeName, 1))
		return nil
	}
	if p.ledger.PodDeltas(added.UID, nodeName, 1) != nil {
		return nil
	}
	s.addDeltas(nodeName, p.nominatedDeltas(ctx, added, nodeInfo, s.deltas[nodeName]))
	return nil
}

// RemovePod frees, hypothetically, the cards of a pod on the node.
func (p *Plugin) RemovePod(_ context.Context, state fwk.CycleState, _ *v1.Pod, podInfoToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := getState(state)
	if s == nil {
		return nil
	}
	nodeName, uid := nodeInfo.Node().Name, podInfoToRemove.GetPod().UID
	if d := p.ledger.PodDeltas(uid, nodeName, -1); d != nil && !s.removed[nodeName].Has(uid) {
		s.addDeltas(nodeName, d)
		if s.removed == nil {
			s.removed = map[string]sets.Set[types.UID]{}
		}
		if s.removed[nodeName] == nil {
			s.removed[nodeName] = sets.New[types.UID]()
		}
		s.removed[nodeName].Insert(uid)
	}
	return nil
}

func (s *cycleState) addDeltas(nodeName string, d []allocator.Delta) {
	if len(d) == 0 {
		return
	}
	if s.deltas == nil {
		s.deltas = map[string][]allocator.Delta{}
	}
	s.deltas[nodeName] = append(s.deltas[nodeName], d...)
}
