package install

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/manifests"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// The admission policies the manifests ship.
const (
	PolicyGPUAssignment         = "tessera-gpu-assignment"
	PolicyGPUPodsBoundByTessera = "tessera-gpu-pods-bound-by-tessera"
	PolicyGPUInventory          = "tessera-gpu-inventory"
	PolicyAgentLeases           = "tessera-agent-leases"
	PolicyAgentPodStatus        = "tessera-agent-pod-status"
	PolicyDRASlices             = "tessera-dra-slices"
	PolicyCDIAnnotations        = "tessera-cdi-annotations"
	PolicyHighPriority          = "tessera-high-priority"
	PolicyResizeStatus          = "tessera-gpushareresize-status"
	PolicySchedulerPodUpdates   = "tessera-scheduler-pod-updates"
	// PolicySchedulerName is the MutatingAdmissionPolicy that sets the
	// profile of a labelled namespace on its GPU pods.
	PolicySchedulerName = "tessera-scheduler-name"
	// PolicyGPUMemoryTotal is the MutatingAdmissionPolicy that gives each
	// container asking GPU memory per card its total, for quotas.
	PolicyGPUMemoryTotal = "tessera-gpu-memory-total"
)

// WaitServed waits until the API server serves the resources of the
// CustomResourceDefinitions among objs (the manifests define GPUReservation
// and GPUShareResize): a CRD is served a moment after it is created, and a
// scheduler started before that would run without it.
func WaitServed(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, timeout time.Duration) error {
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		for _, v := range versions {
			version, _, _ := unstructured.NestedString(v.(map[string]any), "name")
			gv := schema.GroupVersion{Group: group, Version: version}.String()
			err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
				served, err := disco.ServerResourcesForGroupVersion(gv)
				return err == nil && slices.ContainsFunc(served.APIResources, func(a metav1.APIResource) bool { return a.Name == plural }), nil
			})
			if err != nil {
				return fmt.Errorf("%s of %s is not served after %v", plural, gv, timeout)
			}
		}
	}
	return nil
}

// DeniedBy reports whether err is the API server's refusal by the named
// admission policy, by one of its validations: not an expression that
// failed to evaluate (which a failurePolicy of Fail also turns into a
// refusal).
func DeniedBy(err error, policy string) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "ValidatingAdmissionPolicy '"+policy+"'") && !strings.Contains(msg, "resulted in error")
}

// WaitEnforced waits until every admission policy refuses what it exists to
// refuse: the API server loads new policies asynchronously. Each probe is a
// server-side dry run (nothing is stored): an administrator forging an
// assignment, creating a GPU pod bound to a node, hand-writing an inventory
// or a slice of Tessera's driver, annotating a pod with a CDI device or the
// high task priority in a namespace not labelled for it, an agent writing
// another node's Lease, an administrator writing a GPUShareResize's status
// and the scheduler labelling a pod (on a resize and a pod the probe creates
// in Tessera's namespace and deletes after). names are the
// resource names the policies were rendered with.
func WaitEnforced(ctx context.Context, cfg *rest.Config, names gpuinfo.ResourceNames, timeout time.Duration) error {
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	agent, err := kubernetes.NewForConfig(AsAgent(cfg, "probe-node"))
	if err != nil {
		return err
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	pod := func(name string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: manifests.Namespace},
			Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "probe", Image: "probe"}}},
		}
	}
	forged := pod("tessera-probe-forged")
	forged.Annotations = map[string]string{gpuinfo.AssignmentAnnotation: `{"version":1}`}
	bound := pod("tessera-probe-bound")
	bound.Spec.NodeName = "probe-node"
	bound.Spec.Containers[0].Resources.Limits = v1.ResourceList{names.GPU: resource.MustParse("1")}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "tessera-probe-node", Annotations: map[string]string{gpuinfo.InventoryAnnotation: `{"version":1}`}}}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-probe-slice"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpuinfo.DRADriver, NodeName: ptr.To("probe-node"),
			Pool: resourceapi.ResourcePool{Name: "probe-node", ResourceSliceCount: 1}, Devices: []resourceapi.Device{{Name: "gpu-0"}}},
	}
	cdi := pod("tessera-probe-cdi")
	cdi.Namespace = metav1.NamespaceDefault
	cdi.Annotations = map[string]string{"cdi.k8s.io/probe": "nvidia.com/gpu=all"}
	highTask := pod("tessera-probe-high-task")
	highTask.Annotations = map[string]string{gpuinfo.TaskPriorityAnnotation: string(gpuinfo.TaskPriorityHigh)}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: gpuinfo.AgentLeasePrefix + "another-node", Namespace: manifests.Namespace}}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	resizes := dyn.Resource(resizev1alpha1.Resource).Namespace(manifests.Namespace)
	defer resizes.Delete(context.WithoutCancel(ctx), probeResizeName, metav1.DeleteOptions{})
	scheduler, err := kubernetes.NewForConfig(AsScheduler(cfg))
	if err != nil {
		return err
	}
	probePod := pod(probePodName)
	probePod.Spec.SchedulerName = "tessera-probe" // no scheduler takes it
	defer admin.CoreV1().Pods(manifests.Namespace).Delete(context.WithoutCancel(ctx), probePodName, metav1.DeleteOptions{})
	probes := []struct {
		policy string
		try    func(context.Context) error
	}{
		{PolicyGPUAssignment, func(ctx context.Context) error {
			_, err := admin.CoreV1().Pods(forged.Namespace).Create(ctx, forged, dryRun)
			return err
		}},
		{PolicyGPUPodsBoundByTessera, func(ctx context.Context) error {
			_, err := admin.CoreV1().Pods(bound.Namespace).Create(ctx, bound, dryRun)
			return err
		}},
		{PolicyGPUInventory, func(ctx context.Context) error {
			_, err := admin.CoreV1().Nodes().Create(ctx, node, dryRun)
			return err
		}},
		{PolicyAgentLeases, func(ctx context.Context) error {
			_, err := agent.CoordinationV1().Leases(lease.Namespace).Create(ctx, lease, dryRun)
			return err
		}},
		{PolicyDRASlices, func(ctx context.Context) error {
			_, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice, dryRun)
			return err
		}},
		{PolicyCDIAnnotations, func(ctx context.Context) error {
			_, err := admin.CoreV1().Pods(cdi.Namespace).Create(ctx, cdi, dryRun)
			return err
		}},
		{PolicyHighPriority, func(ctx context.Context) error {
			_, err := admin.CoreV1().Pods(highTask.Namespace).Create(ctx, highTask, dryRun)
			return err
		}},
		{PolicySchedulerPodUpdates, func(ctx context.Context) error {
			if _, err := admin.CoreV1().Pods(manifests.Namespace).Create(ctx, probePod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			_, err := scheduler.CoreV1().Pods(manifests.Namespace).Patch(ctx, probePodName, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"tessera-probe":"x"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{PolicyResizeStatus, func(ctx context.Context) error {
			r, err := probeResize(ctx, resizes)
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(r.Object, "probe-node", "status", "nodeName"); err != nil {
				return err
			}
			_, err = resizes.UpdateStatus(ctx, r, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	}
	for _, p := range probes {
		var last error
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			last = p.try(ctx)
			return DeniedBy(last, p.policy), nil
		})
		if err != nil {
			return fmt.Errorf("admission policy %s is not in force after %v (last answer: %v)", p.policy, timeout, last)
		}
	}
	return nil
}

// The objects WaitEnforced creates to probe updates: a GPUShareResize and a
// pod no scheduler takes.
const (
	probeResizeName = "tessera-probe-resize"
	probePodName    = "tessera-probe-pod"
)

// probeResize returns the probe's GPUShareResize in Tessera's namespace (a
// status update needs an object), creating it if need be: right after the
// CRD is created it may not be served yet, and the caller tries again.
func probeResize(ctx context.Context, resizes dynamic.ResourceInterface) (*unstructured.Unstructured, error) {
	r, err := resizes.Get(ctx, probeResizeName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		return r, err
	}
	return resizes.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": resizev1alpha1.Resource.GroupVersion().String(),
		"kind":       resizev1alpha1.Kind,
		"metadata":   map[string]any{"name": probeResizeName},
		"spec":       map[string]any{"podName": "tessera-probe", "container": "probe", "cores": int64(1)},
	}}, metav1.CreateOptions{})
}
