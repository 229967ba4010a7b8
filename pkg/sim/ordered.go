package sim

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// orderedGPUShare is Tessera's plugin without its PreFilter node pruning.
// kube-scheduler iterates a PreFilterResult's node set, a Go map, in random
// order, and among nodes with equal scores the first found wins: with
// pruning, two replays of a seed break ties differently and diverge. Without
// it every node is filtered in the snapshot's order, and a replay is
// reproducible. Placement is otherwise the same: pruning only drops nodes
// Filter would reject.
type orderedGPUShare struct {
	*gpushare.Plugin
}

// newOrderedGPUShare builds the plugin as the scheduler would and wraps it.
func newOrderedGPUShare(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p, err := gpushare.New(ctx, obj, h)
	if err != nil {
		return nil, err
	}
	return &orderedGPUShare{p.(*gpushare.Plugin)}, nil
}

// PreFilter is GPUShare's, keeping every node.
func (o *orderedGPUShare) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	_, status := o.Plugin.PreFilter(ctx, state, pod, nodes)
	return nil, status
}
