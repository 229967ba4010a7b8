package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// PreBindPreFlight skips PreBind for pods without GPUs; the health check of
// GPU pods may run in parallel with other PreBind plugins.
func (p *Plugin) PreBindPreFlight(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if s := getState(state); s == nil || s.assignment == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

// PreBind checks that the node still reports the chosen cards, healthy.
func (p *Plugin) PreBind(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeName string) *fwk.Status {
	s := getState(state)
	if s == nil || s.assignment == nil {
		return nil
	}
	if err := p.ledger.CardsHealthy(nodeName, s.assignment); err != nil {
		return fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	return nil
}

// Bind binds a GPU pod with its assignment on the Binding object: the API
// server copies the Binding's annotations onto the pod in the same write that
// sets its node, so no pod runs without its assignment and no assignment
// survives a failed bind. Other pods are left to the next Bind plugin.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := getState(state)
	if s == nil || s.assignment == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	raw, err := s.assignment.Encode()
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pod.Namespace,
			Name:        pod.Name,
			UID:         pod.UID,
			Annotations: map[string]string{gpuinfo.AssignmentAnnotation: raw},
		},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := p.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(err)
	}
	klog.FromContext(ctx).V(3).Info("Bound pod with its GPU assignment", "pod", klog.KObj(pod), "node", nodeName)
	return nil
}
