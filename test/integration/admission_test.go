package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Expected outcomes of a request besides a policy's name.
const (
	allowed      = ""
	deniedByRBAC = "RBAC"
)

// clientAs is a clientset acting as the given user and groups.
func clientAs(t *testing.T, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(controlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mergePatch is a JSON merge patch setting the given metadata field.
func mergePatch(t *testing.T, field string, value any) []byte {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{field: value}})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestAdmissionPolicies sends every change the shipped admission policies
// forbid, and their legitimate neighbours, to the API server as the users who
// would make them: each forbidden change is refused with a message naming
// its policy (or by RBAC, where the shipped roles already forbid it), and each
// legitimate one passes. Requests are dry runs unless the next case needs
// their result.
func TestAdmissionPolicies(t *testing.T) {
	e := newEnv(t)
	nodeA := e.node("a", cluster.L4, 2, nil)
	nodeB := e.node("b", cluster.L4, 2, nil)
	e.startScheduler()
	e.create(e.podSpec("bound", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024}))
	bound := e.waitBound(30*time.Second, "bound")["bound"]
	assigned := bound.Annotations[gpuinfo.AssignmentAnnotation]

	admin := e.client
	// alice may create and edit pods and resource claims in the test's
	// namespace, and in another that the operator labelled for high
	// priority, as a team's members do. (The aggregated roles admin and edit
	// are empty here: no controller manager fills them.)
	prioritized := e.editableNamespaces("-prioritized", map[string]string{manifests.HighPriorityLabel: manifests.HighPriorityAllowed}, "alice")
	// A class an operator made, above the agent's high-task-priority
	// threshold (100000).
	const aboveThreshold = "tessera-test-production"
	if _, err := admin.SchedulingV1().PriorityClasses().Create(e.tCtx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: aboveThreshold}, Value: 200000,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	e.waitFor(30*time.Second, "the API server's Priority admission to know "+aboveThreshold, func() (bool, error) {
		p := e.podSpec("probe", "", nil)
		p.Spec.PriorityClassName = aboveThreshold
		_, err := admin.CoreV1().Pods(e.ns).Create(e.tCtx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	taskPriorityPod := func(ns, priority, class string) *v1.Pod {
		p := e.podSpec("task-priority", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024})
		p.Namespace, p.Spec.PriorityClassName = ns, class
		p.Annotations = map[string]string{gpuinfo.TaskPriorityAnnotation: priority}
		return p
	}
	alice := clientAs(t, "alice")
	kubelet := clientAs(t, "system:node:"+bound.Spec.NodeName, "system:nodes")
	agentA := e.agentClient(nodeA)
	unboundAgent := clientAs(t, install.AgentUser, "system:serviceaccounts", "system:serviceaccounts:"+manifests.Namespace)
	scheduler, err := kubernetes.NewForConfig(install.AsScheduler(controlPlane.Config))
	if err != nil {
		t.Fatal(err)
	}

	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	slice := func(driver, node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "gpu-0"}}},
		}
	}
	migCounters := func(node string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "tessera.io", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 2},
				SharedCounters: []resourceapi.CounterSet{{Name: gpuinfo.DRAMIGCounterSet(0), Counters: map[string]resourceapi.Counter{gpuinfo.DRASlotCounter(0): {Value: resource.MustParse("1")}}}}},
		}
	}
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	gpuPod := func(name string) *v1.Pod {
		p := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
		p.Spec.NodeName = nodeA
		return p
	}
	forged := e.podSpec("forged", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
	forged.Annotations = map[string]string{gpuinfo.AssignmentAnnotation: assigned}
	initGPU := e.podSpec("init-gpu", "tessera-binpack", nil)
	initGPU.Spec.NodeName = nodeA
	initGPU.Spec.InitContainers = []v1.Container{{Name: "init", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{"tessera.io/gpu-memory": resource.MustParse("1024")},
	}}}
	plain := e.podSpec("plain", "tessera-binpack", nil)
	plain.Spec.NodeName = nodeA
	nodeObj, err := admin.CoreV1().Nodes().Get(e.tCtx, bound.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mirror := gpuPod("static-gpu")
	mirror.Spec.NodeName = nodeObj.Name
	mirror.Annotations = map[string]string{"kubernetes.io/config.mirror": "hash"}
	mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeObj.Name, UID: nodeObj.UID, Controller: ptr.To(true)}}
	unbound := e.create(e.podSpec("unbound", "nobody", map[string]int64{"tessera.io/gpu": 1}))
	fresh := func() *v1.Pod {
		p, err := admin.CoreV1().Pods(e.ns).Get(e.tCtx, "bound", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	invA, err := cluster.SimulatedInventory(nodeA, cluster.L4, 3)
	if err != nil {
		t.Fatal(err)
	}
	grown := mustEncode(t, invA)
	leaseOf := func(node string) *coordinationv1.Lease {
		l, err := admin.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, gpuinfo.AgentLeasePrefix+node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// Stored slices to delete: each node's of Tessera's driver (written as
	// its agent) and one of another driver on node a.
	stored := map[string]string{}
	for _, s := range []struct {
		client       kubernetes.Interface
		driver, node string
	}{{agentA, "tessera.io", nodeA}, {e.agentClient(nodeB), "tessera.io", nodeB}, {admin, "other.example.com", nodeA}} {
		created, err := s.client.ResourceV1().ResourceSlices().Create(e.tCtx, slice(s.driver, s.node), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a ResourceSlice of %s on %s: %v", s.driver, s.node, err)
		}
		stored[s.node+"/"+s.driver] = created.Name
		t.Cleanup(func() {
			_ = admin.ResourceV1().ResourceSlices().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		})
	}

	for _, tc := range []struct {
		name, want string
		do         func() error
	}{
		// The assignment.
		{"a namespace user creates a pod with an assignment", install.PolicyGPUAssignment, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, forged, dry)
			return err
		}},
		{"a ServiceAccount named like the scheduler's, in a tenant's namespace, creates a pod with an assignment", install.PolicyGPUAssignment, func() error {
			impostor := clientAs(t, "system:serviceaccount:"+e.ns+":"+manifests.SchedulerServiceAccount, "system:serviceaccounts", "system:serviceaccounts:"+e.ns, "system:masters")
			_, err := impostor.CoreV1().Pods(e.ns).Create(e.tCtx, forged, dry)
			return err
		}},
		{"a cluster admin creates a pod with an assignment", install.PolicyGPUAssignment, func() error {
			_, err := admin.CoreV1().Pods(e.ns).Create(e.tCtx, forged, dry)
			return err
		}},
		{"a namespace user changes a bound pod's assignment", install.PolicyGPUAssignment, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.AssignmentAnnotation: `{"version":1}`}), dryPatch)
			return err
		}},
		{"a cluster admin removes a bound pod's assignment", install.PolicyGPUAssignment, func() error {
			_, err := admin.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.AssignmentAnnotation: nil}), dryPatch)
			return err
		}},
		{"a namespace user labels a bound pod", allowed, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "labels", map[string]any{"team": "vision"}), dryPatch)
			return err
		}},
		{"the node's kubelet updates a bound pod's status", allowed, func() error {
			p := fresh()
			p.Status.Phase = v1.PodRunning
			_, err := kubelet.CoreV1().Pods(e.ns).UpdateStatus(e.tCtx, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"the node's kubelet changes the assignment through the status", install.PolicyGPUAssignment, func() error {
			p := fresh()
			p.Annotations[gpuinfo.AssignmentAnnotation] = `{"version":1,"containers":{}}`
			_, err := kubelet.CoreV1().Pods(e.ns).UpdateStatus(e.tCtx, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"a cluster admin binds a pod with an assignment", install.PolicyGPUAssignment, func() error {
			return admin.CoreV1().Pods(e.ns).Bind(e.tCtx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{gpuinfo.AssignmentAnnotation: assigned}},
				Target:     v1.ObjectReference{Kind: "Node", Name: nodeA},
			}, metav1.CreateOptions{})
		}},
		{"a cluster admin binds a pod with an assignment through the legacy bindings resource", install.PolicyGPUAssignment, func() error {
			return legacyBind(admin, e.ns, unbound.Name, nodeA, map[string]string{gpuinfo.AssignmentAnnotation: assigned})
		}},
		{"the scheduler binds a pod with its assignment through the legacy bindings resource", allowed, func() error {
			return legacyBind(scheduler, e.ns, unbound.Name, nodeA, map[string]string{gpuinfo.AssignmentAnnotation: assigned})
		}},
		{"the scheduler binds a pod with a CDI annotation through the legacy bindings resource", install.PolicyCDIAnnotations, func() error {
			return legacyBind(scheduler, e.ns, unbound.Name, nodeA, map[string]string{gpuinfo.AssignmentAnnotation: assigned, "cdi.k8s.io/x": "nvidia.com/gpu=all"})
		}},
		{"the scheduler binds a pod with the high task priority through the legacy bindings resource", install.PolicyHighPriority, func() error {
			return legacyBind(scheduler, e.ns, unbound.Name, nodeA, map[string]string{gpuinfo.AssignmentAnnotation: assigned, gpuinfo.TaskPriorityAnnotation: "high"})
		}},
		{"a cluster admin binds a pod with a CDI annotation through pods/binding", install.PolicyCDIAnnotations, func() error {
			return admin.CoreV1().Pods(e.ns).Bind(e.tCtx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"}},
				Target:     v1.ObjectReference{Kind: "Node", Name: nodeA},
			}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		// The scheduler's pod updates (the resize controller).
		{"the scheduler rewrites a bound pod's assignment", allowed, func() error {
			a := assignment(t, fresh())
			for name, cards := range a.Containers {
				for i := range cards {
					a.Containers[name][i].MemoryMiB = 512
				}
			}
			raw, err := a.Encode()
			if err != nil {
				return err
			}
			_, err = scheduler.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.AssignmentAnnotation: raw}), dryPatch)
			return err
		}},
		{"the scheduler labels a pod", install.PolicySchedulerPodUpdates, func() error {
			_, err := scheduler.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "labels", map[string]any{"team": "x"}), dryPatch)
			return err
		}},
		{"the scheduler annotates a pod", install.PolicySchedulerPodUpdates, func() error {
			_, err := scheduler.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{"example.com/x": "y"}), dryPatch)
			return err
		}},
		{"the scheduler removes a bound pod's assignment", install.PolicySchedulerPodUpdates, func() error {
			_, err := scheduler.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.AssignmentAnnotation: nil}), dryPatch)
			return err
		}},
		{"the scheduler changes a bound pod's spec", install.PolicySchedulerPodUpdates, func() error {
			_, err := scheduler.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":5}}`), dryPatch)
			return err
		}},
		// High priority.
		{"a namespace user creates a tessera-critical pod", install.PolicyHighPriority, func() error {
			p := e.podSpec("critical", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
			p.Spec.PriorityClassName = "tessera-critical"
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, p, dry)
			return err
		}},
		{"a namespace user creates a tessera-critical pod in a namespace the operator labelled", allowed, func() error {
			p := e.podSpec("critical", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
			p.Namespace, p.Spec.PriorityClassName = prioritized.Name, "tessera-critical"
			_, err := alice.CoreV1().Pods(prioritized.Name).Create(e.tCtx, p, dry)
			return err
		}},
		{"a namespace user creates a pod with the high task priority", install.PolicyHighPriority, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, taskPriorityPod(e.ns, "high", ""), dry)
			return err
		}},
		{"a namespace user creates a pod with the low task priority", allowed, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, taskPriorityPod(e.ns, "low", ""), dry)
			return err
		}},
		{"a namespace user gives a bound pod the high task priority", install.PolicyHighPriority, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.TaskPriorityAnnotation: "high"}), dryPatch)
			return err
		}},
		{"a namespace user creates a pod with the high task priority in a namespace the operator labelled", allowed, func() error {
			_, err := alice.CoreV1().Pods(prioritized.Name).Create(e.tCtx, taskPriorityPod(prioritized.Name, "high", ""), dry)
			return err
		}},
		{"a namespace user creates a pod with the high task priority and a priority class above the threshold", allowed, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, taskPriorityPod(e.ns, "high", aboveThreshold), dry)
			return err
		}},
		{"a namespace user creates a claim with the high task priority", install.PolicyHighPriority, func() error {
			_, err := alice.ResourceV1().ResourceClaims(e.ns).Create(e.tCtx, taskPriorityClaim(t, e.ns, "taskPriority", "high"), dry)
			return err
		}},
		{"a namespace user creates a claim with the high task priority under a key of another case", install.PolicyHighPriority, func() error {
			_, err := alice.ResourceV1().ResourceClaims(e.ns).Create(e.tCtx, taskPriorityClaim(t, e.ns, "TaskPriority", "high"), dry)
			return err
		}},
		{"a namespace user creates a claim template with the high task priority", install.PolicyHighPriority, func() error {
			claim := taskPriorityClaim(t, e.ns, "taskPriority", "high")
			template := &resourceapi.ResourceClaimTemplate{ObjectMeta: claim.ObjectMeta, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: claim.Spec}}
			_, err := alice.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.tCtx, template, dry)
			return err
		}},
		{"a namespace user creates a claim with the low task priority", allowed, func() error {
			_, err := alice.ResourceV1().ResourceClaims(e.ns).Create(e.tCtx, taskPriorityClaim(t, e.ns, "taskPriority", "low"), dry)
			return err
		}},
		{"a namespace user creates a claim with the high task priority in a namespace the operator labelled", allowed, func() error {
			_, err := alice.ResourceV1().ResourceClaims(prioritized.Name).Create(e.tCtx, taskPriorityClaim(t, prioritized.Name, "taskPriority", "high"), dry)
			return err
		}},
		// CDI devices asked of the runtime.
		{"a namespace user creates a pod annotated with every card as a CDI device", install.PolicyCDIAnnotations, func() error {
			p := e.podSpec("cdi", "tessera-binpack", nil)
			p.Annotations = map[string]string{"cdi.k8s.io/tenant": "nvidia.com/gpu=all"}
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, p, dry)
			return err
		}},
		{"a namespace user annotates a bound pod with a CDI device", install.PolicyCDIAnnotations, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Patch(e.tCtx, "bound", types.MergePatchType, mergePatch(t, "annotations", map[string]any{"cdi.k8s.io/x": "nvidia.com/gpu=1"}), dryPatch)
			return err
		}},
		{"a cluster admin creates a pod with a CDI annotation in Tessera's namespace", allowed, func() error {
			p := e.podSpec("cdi", "", nil)
			p.Namespace = manifests.Namespace
			p.Annotations = map[string]string{"cdi.k8s.io/tessera-node-agent": "nvidia.com/gpu=all"}
			_, err := admin.CoreV1().Pods(manifests.Namespace).Create(e.tCtx, p, dry)
			return err
		}},
		// Bypassing the scheduler.
		{"a cluster admin creates a GPU pod bound to a node", install.PolicyGPUPodsBoundByTessera, func() error {
			_, err := admin.CoreV1().Pods(e.ns).Create(e.tCtx, gpuPod("bypass"), dry)
			return err
		}},
		{"a namespace user creates a pod bound to a node whose init container asks for GPU memory", install.PolicyGPUPodsBoundByTessera, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, initGPU, dry)
			return err
		}},
		{"a namespace user creates a pod without GPUs bound to a node", allowed, func() error {
			_, err := alice.CoreV1().Pods(e.ns).Create(e.tCtx, plain, dry)
			return err
		}},
		{"a kubelet creates the mirror pod of a static GPU pod", allowed, func() error {
			_, err := kubelet.CoreV1().Pods(e.ns).Create(e.tCtx, mirror, dry)
			return err
		}},
		// The inventory.
		{"a cluster admin edits a node's inventory", install.PolicyGPUInventory, func() error {
			_, err := admin.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: grown}), dryPatch)
			return err
		}},
		{"a cluster admin removes a node's inventory", install.PolicyGPUInventory, func() error {
			_, err := admin.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: nil}), dryPatch)
			return err
		}},
		{"a cluster admin creates a node with an inventory", install.PolicyGPUInventory, func() error {
			n := cluster.NewNode(e.ns+"-new", nil)
			n.Annotations = map[string]string{gpuinfo.InventoryAnnotation: grown}
			_, err := admin.CoreV1().Nodes().Create(e.tCtx, n, dry)
			return err
		}},
		{"a cluster admin labels a GPU node", allowed, func() error {
			_, err := admin.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "labels", map[string]any{"pool": "inference"}), dryPatch)
			return err
		}},
		{"an agent publishes its node's inventory", allowed, func() error {
			_, err := agentA.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: grown}), dryPatch)
			return err
		}},
		{"an agent writes another node's inventory", install.PolicyGPUInventory, func() error {
			_, err := agentA.CoreV1().Nodes().Patch(e.tCtx, nodeB, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: grown}), dryPatch)
			return err
		}},
		{"an agent labels its own node", install.PolicyGPUInventory, func() error {
			_, err := agentA.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "labels", map[string]any{"pool": "mine"}), dryPatch)
			return err
		}},
		{"an agent cordons its own node", install.PolicyGPUInventory, func() error {
			_, err := agentA.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), dryPatch)
			return err
		}},
		{"the agent's account without a node-bound token writes an inventory", install.PolicyGPUInventory, func() error {
			_, err := unboundAgent.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: grown}), dryPatch)
			return err
		}},
		{"the scheduler writes an inventory", deniedByRBAC, func() error {
			_, err := scheduler.CoreV1().Nodes().Patch(e.tCtx, nodeA, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: grown}), dryPatch)
			return err
		}},
		// Leases.
		{"an agent renews its node's Lease", allowed, func() error {
			_, err := agentA.CoordinationV1().Leases(manifests.Namespace).Update(e.tCtx, leaseOf(nodeA), metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"an agent renews another node's Lease", install.PolicyAgentLeases, func() error {
			_, err := agentA.CoordinationV1().Leases(manifests.Namespace).Update(e.tCtx, leaseOf(nodeB), metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"an agent creates the scheduler's leader Lease", install.PolicyAgentLeases, func() error {
			_, err := agentA.CoordinationV1().Leases(manifests.Namespace).Create(e.tCtx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tessera-scheduler"}}, dry)
			return err
		}},
		{"an agent writes a Lease outside its namespace", deniedByRBAC, func() error {
			_, err := agentA.CoordinationV1().Leases(e.ns).Create(e.tCtx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: gpuinfo.AgentLeasePrefix + nodeA}}, dry)
			return err
		}},
		// DRA: a node's slice of Tessera's driver.
		{"an agent publishes its node's ResourceSlice", allowed, func() error {
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, slice("tessera.io", nodeA), dry)
			return err
		}},
		{"an agent publishes a ResourceSlice for another node", install.PolicyDRASlices, func() error {
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, slice("tessera.io", nodeB), dry)
			return err
		}},
		{"an agent publishes another driver's ResourceSlice", install.PolicyDRASlices, func() error {
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, slice("other.example.com", nodeA), dry)
			return err
		}},
		{"the agent's account without a node-bound token publishes a ResourceSlice", install.PolicyDRASlices, func() error {
			_, err := unboundAgent.ResourceV1().ResourceSlices().Create(e.tCtx, slice("tessera.io", nodeA), dry)
			return err
		}},
		{"an agent publishes a ResourceSlice on its node with another node's pool", install.PolicyDRASlices, func() error {
			s := slice("tessera.io", nodeA)
			s.Spec.Pool.Name = nodeB
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, s, dry)
			return err
		}},
		// The counters of a dynamic MIG card's placements (docs/mig.md):
		// a slice of counters into another node's pool would let an agent
		// free or block that node's slices.
		{"an agent publishes MIG slot counters in another node's pool", install.PolicyDRASlices, func() error {
			s := migCounters(nodeA)
			s.Spec.Pool.Name = nodeB
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, s, dry)
			return err
		}},
		{"an agent publishes its node's MIG slot counters", allowed, func() error {
			_, err := agentA.ResourceV1().ResourceSlices().Create(e.tCtx, migCounters(nodeA), dry)
			return err
		}},
		{"an agent deletes its node's ResourceSlice", allowed, func() error {
			return agentA.ResourceV1().ResourceSlices().Delete(e.tCtx, stored[nodeA+"/tessera.io"], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"an agent deletes another node's ResourceSlice", install.PolicyDRASlices, func() error {
			return agentA.ResourceV1().ResourceSlices().Delete(e.tCtx, stored[nodeB+"/tessera.io"], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"an agent deletes another driver's ResourceSlice on its node", install.PolicyDRASlices, func() error {
			return agentA.ResourceV1().ResourceSlices().Delete(e.tCtx, stored[nodeA+"/other.example.com"], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"an agent deletes every ResourceSlice", install.PolicyDRASlices, func() error {
			return agentA.ResourceV1().ResourceSlices().DeleteCollection(e.tCtx, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}, metav1.ListOptions{})
		}},
		{"a cluster admin deletes a node's ResourceSlice of Tessera's driver", allowed, func() error {
			return admin.ResourceV1().ResourceSlices().Delete(e.tCtx, stored[nodeB+"/tessera.io"], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"a cluster admin writes a ResourceSlice of Tessera's driver", install.PolicyDRASlices, func() error {
			_, err := admin.ResourceV1().ResourceSlices().Create(e.tCtx, slice("tessera.io", nodeA), dry)
			return err
		}},
		{"a cluster admin writes another driver's ResourceSlice", allowed, func() error {
			_, err := admin.ResourceV1().ResourceSlices().Create(e.tCtx, slice("other.example.com", nodeA), dry)
			return err
		}},
		// What the agent's role does not grant.
		{"an agent binds a pod", deniedByRBAC, func() error {
			return agentA.CoreV1().Pods(e.ns).Bind(e.tCtx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: unbound.Name}, Target: v1.ObjectReference{Kind: "Node", Name: nodeA}}, metav1.CreateOptions{})
		}},
		{"an agent deletes a pod", deniedByRBAC, func() error {
			return agentA.CoreV1().Pods(e.ns).Delete(e.tCtx, "bound", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkAnswer(t, tc.do(), tc.want)
		})
	}
	if p, err := admin.CoreV1().Pods(e.ns).Get(e.tCtx, unbound.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("a refused binding bound the pod anyway: %v", err)
	}
}

// TestWorkloadsMeetPodSecurity creates, as dry runs, the pods the shipped
// Deployment and DaemonSet would create, in namespaces that enforce Pod
// Security levels: the scheduler's pod meets restricted, and the only things
// keeping the agent's from baseline are its host paths and the host's PID
// namespace (to attribute GPU processes to containers).
func TestWorkloadsMeetPodSecurity(t *testing.T) {
	e := newEnv(t)
	objs, err := install.Render(install.Base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind, name, level string
		// wantViolations is what the level's refusal must list, "" for none.
		wantViolations string
	}{
		{"Deployment", "tessera-scheduler", "restricted", ""},
		{"DaemonSet", "tessera-node-agent", "baseline", `host namespaces (hostPID=true), hostPath volumes (volumes "device-plugins", "nri", "vgpu", "vgpu-cache", "cdi", "cdi-static"), privileged (container "agent" must not set securityContext.privileged=true)`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			ns, err := e.client.CoreV1().Namespaces().Create(e.tCtx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
				GenerateName: "psa-" + tc.level + "-",
				Labels:       map[string]string{"pod-security.kubernetes.io/enforce": tc.level},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = e.client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
			})
			workload, err := install.Find(objs, tc.kind, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			template, _, err := unstructured.NestedMap(workload.Object, "spec", "template")
			if err != nil {
				t.Fatal(err)
			}
			pod := &v1.Pod{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(template, pod); err != nil {
				t.Fatal(err)
			}
			pod.Name = tc.name
			_, err = e.client.CoreV1().Pods(ns.Name).Create(e.tCtx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case tc.wantViolations == "" && err != nil:
				t.Errorf("refused at %s: %v", tc.level, err)
			case tc.wantViolations != "" && (err == nil || !strings.HasSuffix(err.Error(), fmt.Sprintf(`violates PodSecurity "%s:latest": %s`, tc.level, tc.wantViolations))):
				t.Errorf("at %s: got %v, want only %s", tc.level, err, tc.wantViolations)
			}
		})
	}
}

// checkAnswer checks a request's answer: allowed, refused by RBAC, or
// refused by the named admission policy.
func checkAnswer(t *testing.T, err error, want string) {
	t.Helper()
	switch want {
	case allowed:
		if err != nil {
			t.Errorf("refused: %v", err)
		}
	case deniedByRBAC:
		if !apierrors.IsForbidden(err) || strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Errorf("got %v, want RBAC's refusal", err)
		}
	default:
		if !install.DeniedBy(err, want) {
			t.Errorf("got %v, want a refusal by %s", err, want)
		}
	}
}

// legacyBind binds the pod to node through the legacy bindings resource
// (POST /api/v1/namespaces/NS/bindings), as a dry run, with annotations the
// binding copies onto the pod.
func legacyBind(client kubernetes.Interface, ns, pod, node string, annotations map[string]string) error {
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: node},
	}
	return client.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").
		Param("dryRun", metav1.DryRunAll).Body(binding).Do(context.Background()).Error()
}

// editableNamespaces creates a namespace named after the test's with suffix
// and the given labels, as an operator would, and lets user edit pods and
// claims there and in the test's own namespace. It returns the new one.
func (e *env) editableNamespaces(suffix string, labels map[string]string, user string) *v1.Namespace {
	e.tCtx.Helper()
	ns, err := e.client.CoreV1().Namespaces().Create(e.tCtx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns + suffix, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	e.tCtx.Cleanup(func() {
		_ = e.client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	for _, name := range []string{e.ns, ns.Name} {
		e.grantEditor(name, user)
	}
	return ns
}

// grantEditor lets user create and edit pods, resource claims and claim
// templates in ns, and waits until the API server's authorizer agrees.
func (e *env) grantEditor(ns, user string) {
	e.tCtx.Helper()
	rbac := e.client.RbacV1()
	if _, err := rbac.Roles(ns).Create(e.tCtx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "editor"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(e.tCtx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-editor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "editor"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	e.waitFor(30*time.Second, user+"'s role binding in "+ns+" to take effect", func() (bool, error) {
		review, err := e.client.AuthorizationV1().SubjectAccessReviews().Create(e.tCtx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "resource.k8s.io", Resource: "resourceclaims"},
		}}, metav1.CreateOptions{})
		return err == nil && review.Status.Allowed, err
	})
}

// taskPriorityClaim is a ResourceClaim asking for one card of Tessera's
// device class, with opaque parameters of Tessera's driver whose task
// priority is set under key.
func taskPriorityClaim(t *testing.T, ns, key, priority string) *resourceapi.ResourceClaim {
	t.Helper()
	raw, err := json.Marshal(map[string]string{"apiVersion": gpuinfo.DRAParametersAPIVersion, "kind": gpuinfo.DRAParametersKind, key: priority})
	if err != nil {
		t.Fatal(err)
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "claim-"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu-share.tessera.io"}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpuinfo.DRADriver, Parameters: runtime.RawExtension{Raw: raw}},
			}}},
		}},
	}
}

// TestSchedulerNamePolicy: in a namespace the operator labelled with a
// profile, a pod asking for GPUs and naming no scheduler gets that
// profile from the API server (the MutatingAdmissionPolicy
// tessera-scheduler-name); a pod naming another scheduler, a pod asking for
// no GPU, and a pod of an unlabelled namespace are left as they are.
func TestSchedulerNamePolicy(t *testing.T) {
	e := newEnv(t)
	labelled := e.editableNamespaces("-spread", map[string]string{"tessera.io/scheduler-profile": "tessera-spread"}, "alice")
	alice := clientAs(t, "alice")
	created := func(ns, scheduler string, limits map[string]int64) string {
		t.Helper()
		p := e.podSpec("probe", scheduler, limits)
		p.Namespace = ns
		got, err := alice.CoreV1().Pods(ns).Create(e.tCtx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("creating a pod in %s: %v", ns, err)
		}
		return got.Spec.SchedulerName
	}
	gpu := map[string]int64{"tessera.io/gpu-memory": 1024}
	// The API server loads policies asynchronously.
	e.waitFor(30*time.Second, "the policy to set the profile", func() (bool, error) {
		return created(labelled.Name, "", gpu) == "tessera-spread", nil
	})
	for _, tc := range []struct {
		name, ns, scheduler string
		limits              map[string]int64
		want                string
	}{
		{"a GPU pod naming no scheduler", labelled.Name, "", gpu, "tessera-spread"},
		{"a GPU pod naming the default scheduler", labelled.Name, "default-scheduler", gpu, "tessera-spread"},
		{"a pod asking for a whole card", labelled.Name, "", map[string]int64{"tessera.io/gpu": 1}, "tessera-spread"},
		{"a GPU pod naming another scheduler", labelled.Name, "volcano", gpu, "volcano"},
		{"a GPU pod naming another Tessera profile", labelled.Name, "tessera-binpack", gpu, "tessera-binpack"},
		{"a pod without GPUs", labelled.Name, "", nil, "default-scheduler"},
		{"a GPU pod in an unlabelled namespace", e.ns, "", gpu, "default-scheduler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := created(tc.ns, tc.scheduler, tc.limits); got != tc.want {
				t.Errorf("schedulerName %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGPUMemoryTotalPolicy: every container asking GPU memory per card gets
// its total (memory × cards) in its requests and limits, from the API server
// (the MutatingAdmissionPolicy tessera-gpu-memory-total), whatever total
// its author wrote; a container asking in percent of a card gets none. A
// ResourceQuota on the total then refuses a 4-card pod that the per-card
// figure would let through, and — forbidding memory in percent — one asking
// in percent, which would escape the total.
func TestGPUMemoryTotalPolicy(t *testing.T) {
	e := newEnv(t)
	ns := e.editableNamespaces("-quota", nil, "alice")
	alice := clientAs(t, "alice")
	total := gpuinfo.Domain + "/gpu-memory-total"
	// Pods no scheduler serves: they must not be placed on another test's
	// nodes after this test.
	pod := func(containers ...v1.Container) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "quota-probe", Namespace: ns.Name},
			Spec: v1.PodSpec{SchedulerName: "no-scheduler", Containers: containers}}
	}
	t.Cleanup(func() {
		_ = e.client.CoreV1().Pods(ns.Name).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	})
	container := func(name string, limits map[string]int64) v1.Container {
		c := v1.Container{Name: name, Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
		for r, v := range limits {
			c.Resources.Limits[v1.ResourceName(r)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
		return c
	}
	totals := func(p *v1.Pod) map[string][2]int64 {
		out := map[string][2]int64{}
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			l, lok := c.Resources.Limits[v1.ResourceName(total)]
			r, rok := c.Resources.Requests[v1.ResourceName(total)]
			if lok || rok {
				out[c.Name] = [2]int64{r.Value(), l.Value()}
			}
		}
		return out
	}
	create := func(p *v1.Pod, dryRun bool) (*v1.Pod, error) {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		return alice.CoreV1().Pods(ns.Name).Create(e.tCtx, p, opts)
	}
	training := container("train", map[string]int64{"tessera.io/gpu": 4, "tessera.io/gpu-memory": 10000})
	// The API server loads policies asynchronously.
	e.waitFor(30*time.Second, "the policy to count the total", func() (bool, error) {
		got, err := create(pod(training), true)
		return err == nil && len(totals(got)) == 1, err
	})
	forged := container("forged", map[string]int64{"tessera.io/gpu": 2, "tessera.io/gpu-memory": 8000, total: 1})
	forged.Resources.Requests = v1.ResourceList{v1.ResourceName(total): resource.MustParse("1")}
	init := container("warmup", map[string]int64{"tessera.io/gpu": 2, "tessera.io/gpu-memory": 2000})
	p := pod(training, container("one-card", map[string]int64{"tessera.io/gpu-memory": 5000}),
		container("percent", map[string]int64{"tessera.io/gpu-memory-percent": 50}), container("cpu-only", nil), forged)
	p.Spec.InitContainers = []v1.Container{init}
	got, err := create(p, true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int64{"train": {40000, 40000}, "one-card": {5000, 5000}, "forged": {16000, 16000}, "warmup": {4000, 4000}}
	if diff := cmp.Diff(want, totals(got)); diff != "" {
		t.Errorf("totals, container: {request, limit} (-want,+got):\n%s", diff)
	}

	// Memory in requests alone (no limits) would escape the policy, which
	// reads limits: the API server refuses it (extended resources must be
	// limited).
	requestsOnly := container("requests-only", nil)
	requestsOnly.Resources = v1.ResourceRequirements{Requests: v1.ResourceList{
		"tessera.io/gpu": resource.MustParse("4"), "tessera.io/gpu-memory": resource.MustParse("10000")}}
	if got, err := create(pod(requestsOnly), true); err == nil {
		t.Errorf("a container asking GPU memory in requests alone was created, with totals %v", totals(got))
	}

	// A quota of 30000 MiB in total: the 4-card pod (10000 MiB per card,
	// 40000 in all) is refused; a 2-card one (20000) is not.
	// Memory in percent of a card has no total: the quota forbids it
	// (hard 0), or a tenant would ask 4 cards × 100 % past it.
	hard := v1.ResourceList{v1.ResourceName("requests." + total): resource.MustParse("30000"),
		"requests.tessera.io/gpu-memory-percent": resource.MustParse("0")}
	quota, err := e.client.CoreV1().ResourceQuotas(ns.Name).Create(e.tCtx, &v1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-memory"}, Spec: v1.ResourceQuotaSpec{Hard: hard},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The quota controller's first sync (no controller manager runs here):
	// the API server's quota admission enforces a quota once it has a status.
	quota.Status = v1.ResourceQuotaStatus{Hard: hard, Used: v1.ResourceList{v1.ResourceName("requests." + total): resource.MustParse("0"),
		"requests.tessera.io/gpu-memory-percent": resource.MustParse("0")}}
	if _, err := e.client.CoreV1().ResourceQuotas(ns.Name).UpdateStatus(e.tCtx, quota, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(30*time.Second, "the quota to refuse the 4-card pod", func() (bool, error) {
		_, err := create(pod(training), false)
		if err == nil {
			return false, alice.CoreV1().Pods(ns.Name).Delete(e.tCtx, "quota-probe", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
			return false, err
		}
		return true, nil
	})
	if _, err := create(pod(container("train", map[string]int64{"tessera.io/gpu": 2, "tessera.io/gpu-memory": 10000})), false); err != nil {
		t.Errorf("a 2-card pod within the quota: %v", err)
	}
	percent := container("train", map[string]int64{"tessera.io/gpu": 4, "tessera.io/gpu-memory-percent": 100})
	if _, err := create(pod(percent), true); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
		t.Errorf("a 4-card pod asking memory in percent, past the quota on the total: %v, want refused by the quota", err)
	}
}
