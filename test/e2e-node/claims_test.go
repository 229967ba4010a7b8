//go:build e2enode

package e2enode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/dra"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// claimPod creates a pod bound to node whose container main uses the
// ResourceClaim claim (claims are allocated by DynamicResources; the pod is
// bound here directly).
func claimPod(tCtx ktesting.TContext, ns, name, claim string) *v1.Pod {
	tCtx.Helper()
	pod := podSpec(ns, name, "")
	pod.Spec.NodeName = node
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	pod, err := suite.cp.Client.CoreV1().Pods(ns).Create(tCtx, pod, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	return pod
}

// allocateClaim creates the claim in the API as the scheduler leaves it:
// result allocated (for request "gpu"), reserved for pod.
func allocateClaim(tCtx ktesting.TContext, claim *resourceapi.ResourceClaim, pod *v1.Pod) *resourceapi.ResourceClaim {
	tCtx.Helper()
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu-share.tessera.io"}}}
	status := claim.Status
	created, err := suite.cp.Client.ResourceV1().ResourceClaims(claim.Namespace).Create(tCtx, claim, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	created.Status = status
	created.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	updated, err := suite.cp.Client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(tCtx, created, metav1.UpdateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	return updated
}

// TestClaimContainer: a container using a DRA claim runs with what the
// driver prepared for the claim — its card as the toolkit's CDI device,
// HAMi-core's limits from the claim's consumed capacity, the claim's own
// region mounted — injected by containerd from the CDI device names kubelet
// passes, whatever the image sets; the NRI plugin leaves it so, having read
// the claim from the API: Tessera's, allocated here, reserved for this pod.
func TestClaimContainer(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := claimPod(tCtx, ns, "claim", "share")

	// The driver as the agent runs it with --dra, writing into the
	// runtime's CDI directory.
	backend, err := discovery.NewSimulated(node, fmt.Sprintf("%dxA100-80GB", cards))
	if err != nil {
		t.Fatal(err)
	}
	nodeCards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	enforcement := enforce.DefaultConfig()
	enforcement.Paths = enforce.Paths{
		HostLibrary: filepath.Join(vgpuDir(), "libvgpu.so"), HostPreload: filepath.Join(vgpuDir(), "ld.so.preload"),
		HostCacheDir: filepath.Join(vgpuDir(), "cache"),
	}
	driver := &dra.Driver{Node: node, Enforce: enforcement, CDIDir: filepath.Join(suite.dir, "containerd", "cdi")}
	driver.Update(nodeCards)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "share", Namespace: ns},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: gpuinfo.DRADriver, Pool: node, Device: "gpu-1", ShareID: ptr.To(types.UID("6f1d2c3b-0000-4000-8000-000000000001")),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("4Gi"), "cores": resource.MustParse("30")},
			}},
			Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpuinfo.DRADriver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Limited"}`)}},
			}}},
		}}},
	}
	claim = allocateClaim(tCtx, claim, pod)
	prepared, err := driver.PrepareResourceClaims(tCtx, []*resourceapi.ResourceClaim{claim})
	if err != nil || prepared[claim.UID].Err != nil {
		t.Fatalf("prepare: %v, %v", err, prepared[claim.UID].Err)
	}
	tCtx.Cleanup(func() {
		_, _ = driver.UnprepareResourceClaims(tCtx, []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	})
	var ids []string
	for _, d := range prepared[claim.UID].Devices {
		ids = append(ids, d.CDIDeviceIDs...)
	}

	sb := runSandbox(tCtx, pod, "")
	id, err := createAsKubelet(tCtx, sb, pod, "main", ids...)
	if err != nil {
		t.Fatalf("creating the claim's container with CDI devices %v: %v", ids, err)
	}
	r, err := suite.runtime.start(tCtx, id)
	if err != nil {
		t.Fatal(err)
	}
	share := []gpuinfo.CardAssignment{{Index: 1, UUID: nodeCards[1].UUID, MemoryMiB: 4096, Cores: 30}}
	region := "claim-" + string(claim.UID) + ".cache"
	checkEnv(t, "claim container", r, wantShared(share, region, "1"))
	checkDevices(t, "claim container", r, share)
	checkInterception(t, "claim container", r, region)
}

// TestForeignClaim: a container whose only claim is another driver's (a
// NIC's) — allocated, reserved for its pod, its CDI device passed as kubelet
// passes it — gets that device and no card, though its image asks for
// every card (NVIDIA_VISIBLE_DEVICES=all) and no interception applies.
func TestForeignClaim(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := claimPod(tCtx, ns, "nic-user", "nic")
	allocateClaim(tCtx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "nic", Namespace: ns},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: foreignKind[:strings.Index(foreignKind, "/")], Pool: node, Device: "eth1"}},
		}}},
	}, pod)
	r := func() *running {
		id, err := createAsKubelet(tCtx, runSandbox(tCtx, pod, ""), pod, "main", foreignKind+"=eth1")
		if err != nil {
			t.Fatalf("creating the container of a foreign claim: %v", err)
		}
		r, err := suite.runtime.start(tCtx, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}()
	checkNoGPU(t, "foreign claim", r)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/dev/example-nic", r.pid)); err != nil {
		t.Errorf("the foreign driver's device did not reach the container: %v", err)
	}
}
