package sim

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// orderedGPUShare is Tessera's plugin with its PreFilter node pruning done
// in Filter instead. kube-scheduler iterates a PreFilterResult's node set, a
// Go map, in random order, and among nodes with equal scores the first
// found wins: with pruning, two replays of a seed break ties differently and
// diverge. So PreFilter returns no node set and every node is filtered in
// the snapshot's order, and Filter rejects at once, with the status pruning
// gives, the nodes pruning would have left out, before any work on them.
// Placement is otherwise the same: pruning only drops nodes Filter would
// reject. PostFilter skips GPUShare's explanation of the failure, which
// only words the pod's condition.
type orderedGPUShare struct {
	*gpushare.Plugin
}

var _ fwk.PostFilterPlugin = &orderedGPUShare{}

// newOrderedGPUShare builds the plugin as the scheduler would and wraps it.
func newOrderedGPUShare(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p, err := gpushare.New(ctx, obj, h)
	if err != nil {
		return nil, err
	}
	return &orderedGPUShare{p.(*gpushare.Plugin)}, nil
}

// prunedKey is where PreFilter leaves the nodes pruning keeps.
const prunedKey fwk.StateKey = "sim/" + gpushare.Name + "/kept"

// keptNodes is the node set of GPUShare's PreFilterResult.
type keptNodes struct{ names sets.Set[string] }

// Clone shares the set, which is never written after PreFilter.
func (k *keptNodes) Clone() fwk.StateData { return k }

// notKept is the message kube-scheduler gives nodes a PreFilterResult leaves
// out.
const notKept = "node(s) didn't satisfy plugin(s) [" + gpushare.Name + "]"

// PreFilter is GPUShare's, keeping every node and remembering the set it
// would have pruned to.
func (o *orderedGPUShare) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	res, status := o.Plugin.PreFilter(ctx, state, pod, nodes)
	if res != nil && !res.AllNodes() {
		state.Write(prunedKey, &keptNodes{names: res.NodeNames})
	}
	return nil, status
}

// Filter rejects the nodes pruning would have left out, then is GPUShare's.
func (o *orderedGPUShare) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	if data, err := state.Read(prunedKey); err == nil && !data.(*keptNodes).names.Has(nodeInfo.Node().Name) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, notKept)
	}
	return o.Plugin.Filter(ctx, state, pod, nodeInfo)
}

// PostFilter leaves the failure unexplained and preempts nothing, as
// GPUShare's does; GPUSharePreemption runs after it as usual.
func (o *orderedGPUShare) PostFilter(context.Context, fwk.CycleState, *v1.Pod, fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	return nil, fwk.NewStatus(fwk.Unschedulable)
}
