package gpushare

import (
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// cpuOnlyStateKey is where PreScore leaves what Score needs for a pod that
// asks for no GPUs: every CPU it takes on a GPU node can strand that node's
// free cards, so it is scored too (cpuOnlyScore).
const cpuOnlyStateKey fwk.StateKey = Name + "/cpu-only"

// fragmentationScale turns a fragmentation delta (per mille of a card) into
// score units with two decimals; the remainder ranks ties by usage.
const (
	fragmentationScale = 100
	usageRange         = 2048
)

// usesWorkload reports whether a policy of this plugin measures fragmentation.
func (p *Plugin) usesWorkload() bool {
	return p.nodePolicy == allocator.FragmentationAware || p.gpuPolicy == allocator.FragmentationAware
}

// strategy is the card policy for a node, with the cards reservations keep
// from the pod, and with the workload and the node's CPU when the policies
// measure fragmentation (w is nil otherwise).
func (p *Plugin) strategy(w *allocator.Workload, reserved []*reservation, nodeInfo fwk.NodeInfo, cpuMilli int64) allocator.Strategy {
	st := allocator.Strategy{Policy: p.gpuPolicy}
	if nodeInfo == nil {
		return st
	}
	st.Reserve = reservedOn(reserved, nodeInfo.Node())
	if w == nil {
		return st
	}
	st.Workload, st.CPUMilli = w, cpuMilli
	st.CPUFreeMilli = nodeInfo.GetAllocatable().GetMilliCPU() - nodeInfo.GetRequested().GetMilliCPU()
	return st
}

// podCPUMilli is the pod's effective CPU request.
func podCPUMilli(pod *v1.Pod) int64 {
	cpu := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})[v1.ResourceCPU]
	return cpu.MilliValue()
}

// fragmentationScore ranks a placement for the fragmentation-aware node
// policy: the less it raises the node's fragmentation the better, then the
// fuller the node.
func fragmentationScore(out allocator.Outcome) int64 {
	return -int64(out.FragmentationDelta*fragmentationScale)*usageRange + out.UsedPermille
}

// cpuOnlyState is the cycle state of a pod without GPUs; workload is set
// under the fragmentation-aware node policy only.
type cpuOnlyState struct {
	workload *allocator.Workload
	cpuMilli int64
	// claimNodes are the nodes whose cards are DRA devices, which the
	// ledger does not know.
	claimNodes map[string]*claimNode
}

// Clone returns the state itself: it is read-only.
func (s *cpuOnlyState) Clone() fwk.StateData { return s }

func getCPUOnlyState(state fwk.CycleState) *cpuOnlyState {
	v, err := state.Read(cpuOnlyStateKey)
	if err != nil {
		return nil
	}
	s, _ := v.(*cpuOnlyState)
	return s
}

// rankScores maps scores to 100 for the best, 99 for the next distinct
// value and so on (0 at the floor): unlike scaling to the range, it keeps
// the best node alone at the top however close the others come.
func rankScores(scores fwk.NodeScoreList) {
	distinct := make([]int64, len(scores))
	for i := range scores {
		distinct[i] = scores[i].Score
	}
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	for i := range scores {
		rank, _ := slices.BinarySearch(distinct, scores[i].Score)
		scores[i].Score = max(fwk.MaxNodeScore-int64(len(distinct)-1-rank), fwk.MinNodeScore)
	}
}

// weighedWorkload keeps the learned workload weighed by the scarcity of the
// fleet's card models (allocator.Workload.WeighByScarcity) until either
// changes, and the fleet's usable cards by model until an inventory does.
type weighedWorkload struct {
	mu         sync.Mutex
	generation uint64
	cards      map[string]int
	learned    *allocator.Workload
	weighed    *allocator.Workload
}

// workload is the mix the fragmentation-aware policies measure nodes
// against: the learned workload, its model-constrained shapes weighed by
// how scarce their cards are in the fleet.
func (f *feed) workload() *allocator.Workload {
	learned := f.learner.Workload()
	generation := f.ledger.InventoryGeneration()
	f.weighed.mu.Lock()
	defer f.weighed.mu.Unlock()
	if f.weighed.cards == nil || f.weighed.generation != generation {
		f.weighed.cards, f.weighed.generation, f.weighed.learned = f.ledger.UsableCardsByModel(), generation, nil
	}
	if f.weighed.learned != learned {
		f.weighed.learned, f.weighed.weighed = learned, learned.WeighByScarcity(f.weighed.cards)
	}
	return f.weighed.weighed
}
