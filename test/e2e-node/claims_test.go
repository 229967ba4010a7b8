//go:build e2enode

package e2enode

import (
	"fmt"
	"path/filepath"
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

// TestClaimContainer: a container using a DRA claim runs with what the
// driver prepared for the claim — its card as the toolkit's CDI device,
// HAMi-core's limits from the claim's consumed capacity, the library
// mounted — injected by containerd from the CDI device names kubelet passes,
// whatever the image sets; the NRI plugin leaves it so.
func TestClaimContainer(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := podSpec(ns, "claim", "")
	pod.Spec.NodeName = node // claims are allocated by DynamicResources; the pod is bound here directly
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("share")}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	pod, err := suite.cp.Client.CoreV1().Pods(ns).Create(tCtx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

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
		HostCacheDir: filepath.Join(vgpuDir(), "cache"), HostLockDir: filepath.Join(vgpuDir(), "lock"),
	}
	driver := &dra.Driver{Node: node, Enforce: enforcement, CDIDir: filepath.Join(suite.dir, "containerd", "cdi")}
	driver.Update(nodeCards)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "share", Namespace: ns, UID: "e2e-claim-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: gpuinfo.DRADriver, Pool: node, Device: "gpu-1", ShareID: ptr.To(types.UID("s1")),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("4Gi"), "cores": resource.MustParse("30")},
			}},
			Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpuinfo.DRADriver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Limited"}`)}},
			}}},
		}}},
	}
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
	want := wantShared(pod, "main", share, "1")
	want["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = "/usr/local/vgpu/cache/claim-" + string(claim.UID) + ".cache"
	checkEnv(t, "claim container", r, want)
	checkDevices(t, "claim container", r, share)
	checkInterception(t, "claim container", r, true)
}
