package gpushare

import (
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// prune narrows a one-container GPU pod's nodes (not a MIG pod's: the
// ledger's room counts whole cards only), in PreFilter, to those whose
// cards could possibly hold it (ledger.MayHold), so that no plugin's Filter
// runs on the rest — on a packed fleet, most nodes. It keeps every node
// preemption could use: it prunes only pods that cannot preempt (no GPU pod
// of lower priority is placed anywhere, or preemptionPolicy Never). It keeps
// nodes the ledger may not yet know as they are (a pod deleted or an
// inventory changed a moment ago), which Filter's checks handle. When it
// would keep most nodes it returns nil: a long list costs more than it
// saves; when it would keep none, too, so that the pending pod's message
// says node by node what is missing.
func (p *Plugin) prune(pod *v1.Pod, s *cycleState) *fwk.PreFilterResult {
	lister := p.handle.SnapshotSharedLister()
	if len(s.req.Containers) != 1 || s.req.Isolation.MIG() || lister == nil || p.mayPreempt(pod) {
		return nil
	}
	nodes, err := lister.NodeInfos().List()
	if err != nil {
		return nil
	}
	c := &s.req.Containers[0]
	if !p.worthPruning(nodes, c) {
		return nil
	}
	keep := make([]string, 0, len(nodes)/2)
	var ruledOut []fwk.NodeInfo
	tooMany := false
	p.ledger.Read(func(r ledger.Reader) {
		for _, nodeInfo := range nodes {
			node := nodeInfo.Node()
			switch {
			case node == nil:
			case r.MayHold(node, c):
				if keep = append(keep, node.Name); len(keep)*2 > len(nodes) {
					tooMany = true
					return
				}
			default:
				ruledOut = append(ruledOut, nodeInfo)
			}
		}
	})
	if tooMany {
		return nil
	}
	// Nodes where the ledger may still hold a pod the API no longer has are
	// kept, as Filter rechecks them (checked outside Read: it asks the
	// ledger).
	for _, nodeInfo := range ruledOut {
		if p.mayBeStale(nodeInfo, p.records.lookup(nodeInfo.Node())) {
			if keep = append(keep, nodeInfo.Node().Name); len(keep)*2 > len(nodes) {
				return nil
			}
		}
	}
	if len(keep) == 0 {
		// Nothing can hold it: let Filter say why, node by node.
		return nil
	}
	return &fwk.PreFilterResult{NodeNames: sets.New(keep...)}
}

// mayPreempt reports whether the pod could preempt a GPU pod: it may
// preempt, and some GPU pod placed in the cluster has a lower priority.
func (p *Plugin) mayPreempt(pod *v1.Pod) bool {
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return false
	}
	lowest, any := p.priorities.lowest()
	return any && lowest < corev1helpers.PodPriority(pod)
}

// pruneSample is how many nodes, evenly spread over the fleet, are tried
// before the whole list: when most of them may hold the pod, so would most
// of the fleet, and pruning would cost more than it saves.
const pruneSample = 64

// worthPruning reports whether at most half the nodes may hold c: not when
// more than half have c.Count entirely free cards (counted by the ledger, no
// pass over the nodes), else when at most half the sampled nodes may.
func (p *Plugin) worthPruning(nodes []fwk.NodeInfo, c *gpuinfo.ContainerRequest) bool {
	worth := false
	p.ledger.Read(func(r ledger.Reader) {
		if r.NodesWithFreeCards(c.Count)*2 > len(nodes) {
			return
		}
		step := max(len(nodes)/pruneSample, 1)
		sampled, may := 0, 0
		for i := 0; i < len(nodes); i += step {
			if node := nodes[i].Node(); node != nil {
				sampled++
				if r.MayHold(node, c) {
					may++
				}
			}
		}
		worth = may*2 <= sampled
	})
	return worth
}

// prunedByGPUShare reports whether a node's status is PreFilter's verdict
// for the nodes a PreFilterResult left out, GPUShare's among them.
func prunedByGPUShare(st *fwk.Status) bool {
	return st.Code() == fwk.UnschedulableAndUnresolvable && st.Plugin() == "" &&
		strings.Contains(st.Message(), "didn't satisfy plugin(s) [") && strings.Contains(st.Message(), Name)
}

// priorities counts the priorities of the GPU pods placed in the cluster,
// bound or assumed, so PreFilter knows whether a pod could preempt one.
type priorities struct {
	mu    sync.Mutex
	byPod map[types.UID]int32
	count map[int32]int
}

// set records a placed GPU pod's priority.
func (ps *priorities) set(uid types.UID, priority int32) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.byPod == nil {
		ps.byPod, ps.count = map[types.UID]int32{}, map[int32]int{}
	}
	if old, ok := ps.byPod[uid]; ok {
		if old == priority {
			return
		}
		ps.dropLocked(old)
	}
	ps.byPod[uid] = priority
	ps.count[priority]++
}

// forget drops a pod that no longer holds cards.
func (ps *priorities) forget(uid types.UID) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if old, ok := ps.byPod[uid]; ok {
		delete(ps.byPod, uid)
		ps.dropLocked(old)
	}
}

func (ps *priorities) dropLocked(priority int32) {
	if ps.count[priority]--; ps.count[priority] <= 0 {
		delete(ps.count, priority)
	}
}

// lowest is the lowest priority of a placed GPU pod, if there is one.
func (ps *priorities) lowest() (int32, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var low int32
	found := false
	for priority := range ps.count {
		if !found || priority < low {
			low, found = priority, true
		}
	}
	return low, found
}
