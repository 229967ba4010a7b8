package sim

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// namespace holds the replayed pods.
const namespace = "default"

// maxPodsPerNode is each simulated node's pod capacity: the trace packs many
// small tasks on a node and the artifact sets no pod limit.
const maxPodsPerNode = 1000

var podsResource = v1.SchemeGroupVersion.WithResource("pods")

// neverPreempt: the protocol skips tasks that do not fit. With every task at
// one priority preemption could not succeed anyway; this spares the dry run.
var neverPreempt = v1.PreemptNever

// node builds the Kubernetes node of a trace node, with the inventory its
// agent would publish.
func node(n trace.Node) (*v1.Node, error) {
	inv := n.Inventory()
	raw, err := inv.Encode()
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	// The card count as the agent's device plugin advertises it to kubelet.
	alloc := v1.ResourceList{
		v1.ResourceCPU:                     *resource.NewMilliQuantity(n.CPUMilli, resource.DecimalSI),
		v1.ResourceMemory:                  *resource.NewQuantity(n.MemoryMiB<<20, resource.BinarySI),
		v1.ResourcePods:                    *resource.NewQuantity(maxPodsPerNode, resource.DecimalSI),
		gpuinfo.DefaultResourceNames().GPU: *resource.NewQuantity(int64(len(inv.Cards)*gpuinfo.DefaultSplitCount), resource.DecimalSI),
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name,
			UID:  types.UID("node-" + n.Name),
			// The fake clientset keeps what it is given, and a replay never
			// changes a node: one version, as an API server would give it,
			// lets the ledger know the inventory by it instead of comparing
			// the annotation on every node for every pod.
			ResourceVersion: nodeResourceVersion,
			Labels:          map[string]string{v1.LabelHostname: n.Name},
			Annotations:     map[string]string{gpuinfo.InventoryAnnotation: raw},
		},
		Status: v1.NodeStatus{Capacity: alloc, Allocatable: alloc},
	}, nil
}

// nodeResourceVersion is every replayed node's resourceVersion.
const nodeResourceVersion = "1"

// pod builds the pod of a trace task for a scheduler profile. It requests CPU
// and the task's GPU share but not host memory: the artifact's simulator fits
// tasks on CPU and GPU only, and the comparison keeps its rules.
func pod(t trace.Task, i int, schedulerName string) *v1.Pod {
	res := t.Limits()
	delete(res, v1.ResourceMemory)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        t.Name,
			Namespace:   namespace,
			UID:         types.UID(fmt.Sprintf("task-%d", i)),
			Annotations: t.Annotations(),
		},
		Spec: v1.PodSpec{
			SchedulerName:    schedulerName,
			PreemptionPolicy: &neverPreempt,
			Containers: []v1.Container{{
				Name: "task", Image: "trace",
				Resources: v1.ResourceRequirements{Requests: res, Limits: res},
			}},
		},
	}
}

// bindReactor does what the API server does with a pods/binding create: it
// sets the pod's node and copies the Binding's annotations (the GPU
// assignment) onto the pod.
func bindReactor(tracker clienttesting.ObjectTracker) clienttesting.ReactionFunc {
	return func(action clienttesting.Action) (bool, runtime.Object, error) {
		create, ok := action.(clienttesting.CreateAction)
		if !ok || action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b, ok := create.GetObject().(*v1.Binding)
		if !ok {
			return true, nil, fmt.Errorf("binding: unexpected object %T", create.GetObject())
		}
		obj, err := tracker.Get(podsResource, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		p := obj.(*v1.Pod).DeepCopy()
		if p.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(podsResource.GroupResource(), b.Name, fmt.Errorf("pod is already bound to %s", p.Spec.NodeName))
		}
		p.Spec.NodeName = b.Target.Name
		for k, v := range b.Annotations {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[k] = v
		}
		return true, b, tracker.Update(podsResource, p, b.Namespace)
	}
}
