package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// reasonNoAssignment is Bind's error for a GPU pod that reaches it without
// the cards Reserve chose.
const reasonNoAssignment = "GPU pod has no card assignment (its reservation was undone); not binding it without one"

// Bind binds a GPU pod with its assignment on the Binding object: the API
// server copies the Binding's annotations onto the pod in the same write that
// sets its node, so no pod runs without its assignment and no assignment
// survives a failed bind. First it checks that the node still reports every
// chosen card, healthy; if not, the pod is rejected and tried again. (The
// check is here rather than in PreBind: a pod with PreBind work gets its
// nominated node written to the API before binding, a second write per pod
// that an in-memory check does not need.) A GPU pod without an assignment
// (its reservation was undone) is never bound: the next Bind plugin would
// bind it without one. Other pods are left to the next Bind plugin.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := getState(state)
	if s == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	if s.assignment == nil {
		return fwk.NewStatus(fwk.Error, reasonNoAssignment)
	}
	if err := p.ledger.CardsHealthy(nodeName, s.assignment); err != nil {
		return fwk.NewStatus(fwk.Unschedulable, err.Error())
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
