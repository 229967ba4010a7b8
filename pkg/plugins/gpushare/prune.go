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
)

// prune narrows a one-container GPU pod's nodes, in PreFilter, to those whose
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
	if len(s.req.Containers) != 1 || lister == nil || p.mayPreempt(pod) {
		return nil
	}
	nodes, err := lister.NodeInfos().List()
	if err != nil {
		return nil
	}
	c := &s.req.Containers[0]
	keep := make([]string, 0, len(nodes)/2)
	for _, nodeInfo := range nodes {
		node := nodeInfo.Node()
		if node == nil {
			continue
		}
		raw, present := node.Annotations[gpuinfo.InventoryAnnotation]
		if !p.ledger.MayHoldCurrent(node.Name, raw, present, c) && !p.mayBeStale(nodeInfo) {
			continue
		}
		if keep = append(keep, node.Name); len(keep)*2 > len(nodes) {
			return nil
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
