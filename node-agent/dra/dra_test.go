package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
)

const node = "node-a"

var testCards = []discovery.Card{
	{Index: 1, UUID: "GPU-bbb", Model: "NVIDIA L4", MemoryMiB: 23034, NUMANode: -1, Healthy: true},
	{Index: 0, UUID: "GPU-aaa", Model: "NVIDIA L4", MemoryMiB: 23034, NUMANode: 0, Healthy: true},
	{Index: 2, UUID: "GPU-ccc", Model: "NVIDIA L4", MemoryMiB: 23034, NUMANode: 0, Healthy: false},
}

// result is an allocation result of the driver's pool for device, with
// the consumed capacity given (none when memory is empty).
func result(request, device, memory, cores string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: "tessera.io", Pool: node, Device: device}
	if memory != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory), "cores": resource.MustParse(cores)}
	}
	return r
}

// config is a driver configuration from source with raw parameters.
func config(source resourceapi.AllocationConfigSource, raw string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "tessera.io", Parameters: runtime.RawExtension{Raw: []byte(raw)}},
	}}
}

const (
	limited = `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Limited"}`
	whole   = `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Whole"}`
	high    = `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","taskPriority":"high"}`
)

func claim(results []resourceapi.DeviceRequestAllocationResult, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results, Config: configs},
		}},
	}
}

func TestPrepare(t *testing.T) {
	cfg := enforce.DefaultConfig()
	cfg.Paths.HostCacheDir = t.TempDir()
	paths := cfg.Paths
	// In the CDI library's order: a stable sort by the depth of the
	// container path. The claim's own region, and no other.
	shareMounts := []string{paths.HostPreload + ":/etc/ld.so.preload", paths.HostLibrary + ":/usr/local/vgpu/libvgpu.so",
		paths.HostCacheDir + "/claim-uid-1.cache:/usr/local/vgpu/cache/claim-uid-1.cache"}
	for _, tc := range []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		wantEnv []string
		// wantMounts are host:container, in the CDI library's order.
		wantMounts  []string
		wantDevices []string
		wantErr     string
	}{{
		name:  "a share of one card",
		claim: claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-1", "7Gi", "30")}, config(resourceapi.AllocationConfigSourceClass, limited)),
		wantEnv: []string{"TESSERA_CLAIM=uid-1", "NVIDIA_VISIBLE_DEVICES=GPU-bbb", "CUDA_DEVICE_MEMORY_LIMIT_0=7168m", "CUDA_DEVICE_SM_LIMIT_0=30",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache/claim-uid-1.cache", "GPU_CORE_UTILIZATION_POLICY=force", "CUDA_TASK_PRIORITY=1", "TESSERA_CLAIM_GPU_0=GPU-bbb"},
		wantMounts:  shareMounts,
		wantDevices: []string{"tessera.io/claim=uid-1-gpu-1 nvidia.com/gpu=1"},
	}, {
		name: "two cards, the claim's configuration over the class's, a quantity not in whole MiB",
		claim: claim([]resourceapi.DeviceRequestAllocationResult{result("gpus", "gpu-0", "1000000", "100"), result("gpus", "gpu-1", "2Gi", "100")},
			config(resourceapi.AllocationConfigSourceClass, limited), config(resourceapi.AllocationConfigSourceClaim, high, "gpus")),
		wantEnv: []string{"TESSERA_CLAIM=uid-1", "NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb", "CUDA_DEVICE_MEMORY_LIMIT_0=1m", "CUDA_DEVICE_SM_LIMIT_0=100",
			"CUDA_DEVICE_MEMORY_LIMIT_1=2048m", "CUDA_DEVICE_SM_LIMIT_1=100",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache/claim-uid-1.cache", "CUDA_TASK_PRIORITY=0", "TESSERA_CLAIM_GPU_0=GPU-aaa", "TESSERA_CLAIM_GPU_1=GPU-bbb"},
		wantMounts:  shareMounts,
		wantDevices: []string{"tessera.io/claim=uid-1-gpu-0 nvidia.com/gpu=0", "tessera.io/claim=uid-1-gpu-1 nvidia.com/gpu=1"},
	}, {
		name:        "whole cards: no interception",
		claim:       claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "23034Mi", "100"), {Request: "other", Driver: "other.example.com", Pool: node, Device: "x"}}, config(resourceapi.AllocationConfigSourceClass, whole)),
		wantEnv:     []string{"TESSERA_CLAIM=uid-1", "NVIDIA_VISIBLE_DEVICES=GPU-aaa", "TESSERA_CLAIM_GPU_0=GPU-aaa"},
		wantDevices: []string{"tessera.io/claim=uid-1-gpu-0 nvidia.com/gpu=0"},
	}, {
		name:        "a result without consumed capacity is the whole card",
		claim:       claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "", "")}, config(resourceapi.AllocationConfigSourceClass, whole)),
		wantEnv:     []string{"TESSERA_CLAIM=uid-1", "NVIDIA_VISIBLE_DEVICES=GPU-aaa", "TESSERA_CLAIM_GPU_0=GPU-aaa"},
		wantDevices: []string{"tessera.io/claim=uid-1-gpu-0 nvidia.com/gpu=0"},
	}, {
		name:  "another node's pool: nothing to prepare here",
		claim: claim([]resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "tessera.io", Pool: "node-b", Device: "gpu-0"}}),
	}, {
		name:    "whole cards asked of a share",
		claim:   claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "1Gi", "100")}, config(resourceapi.AllocationConfigSourceClass, whole)),
		wantErr: `request "gpu": sharing Whole needs the whole card, but the allocation consumes 1024 of 23034 MiB`,
	}, {
		name:    "invalid parameters",
		claim:   claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "1Gi", "10")}, config(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Most"}`)),
		wantErr: `request "gpu": configuration from the fromclaim: parameters of driver tessera.io: sharing must be Limited or Whole, got "Most"`,
	}, {
		name: "requests configured apart",
		claim: claim([]resourceapi.DeviceRequestAllocationResult{result("a", "gpu-0", "1Gi", "10"), result("b", "gpu-1", "1Gi", "10")},
			config(resourceapi.AllocationConfigSourceClaim, high, "a")),
		wantErr: `request "b": its parameters`,
	}, {
		name:    "a card out of service",
		claim:   claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-2", "1Gi", "10")}),
		wantErr: `request "gpu": card 2 (GPU-ccc) is out of service`,
	}, {
		name:    "a device the node does not have",
		claim:   claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-7", "1Gi", "10")}),
		wantErr: `request "gpu": device gpu-7 is not a card of node node-a`,
	}, {
		name: "admin access",
		claim: func() *resourceapi.ResourceClaim {
			r := result("gpu", "gpu-0", "1Gi", "10")
			r.AdminAccess = ptr.To(true)
			return claim([]resourceapi.DeviceRequestAllocationResult{r})
		}(),
		wantErr: `request "gpu": admin access to Tessera's cards is not supported`,
	}, {
		name:    "not allocated",
		claim:   &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-1"}},
		wantErr: "claim ns/c: not allocated",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(filepath.Join(paths.HostCacheDir, "claim-uid-1.cache")) // an earlier case's
			d := &Driver{Node: node, Enforce: cfg, CDIDir: t.TempDir()}
			d.Update(testCards)
			got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{tc.claim})
			if err != nil {
				t.Fatal(err)
			}
			res := got[tc.claim.UID]
			if tc.wantErr != "" {
				if res.Err == nil || !strings.Contains(res.Err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", res.Err, tc.wantErr)
				}
				return
			}
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			var devices, ids []string
			for _, dev := range res.Devices {
				devices = append(devices, strings.Join(dev.CDIDeviceIDs, " "))
				ids = append(ids, dev.CDIDeviceIDs[0])
			}
			if diff := cmp.Diff(tc.wantDevices, devices); diff != "" {
				t.Errorf("CDI devices (-want,+got):\n%s", diff)
			}
			if len(ids) == 0 {
				return
			}
			// What a runtime makes of the spec: every device of the claim
			// injected at once, the claim's edits applied once.
			cache, err := cdi.NewCache(cdi.WithSpecDirs(d.CDIDir), cdi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			spec := &rspec.Spec{Process: &rspec.Process{}, Linux: &rspec.Linux{}}
			if _, err := cache.InjectDevices(spec, ids...); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantEnv, spec.Process.Env); diff != "" {
				t.Errorf("environment (-want,+got):\n%s", diff)
			}
			var mounts []string
			for _, m := range spec.Mounts {
				mounts = append(mounts, m.Source+":"+m.Destination)
			}
			if diff := cmp.Diff(tc.wantMounts, mounts); diff != "" {
				t.Errorf("mounts (-want,+got):\n%s", diff)
			}
			// A share's region is there, empty, before any container starts.
			info, err := os.Stat(filepath.Join(paths.HostCacheDir, "claim-uid-1.cache"))
			if shared := len(tc.wantMounts) > 0; shared != (err == nil) || (shared && info.Size() != 0) {
				t.Errorf("the claim's region: %v, %v; want one, empty, only for a share", info, err)
			}
		})
	}
}

// TestPrepareBeforeDiscovery: a claim arriving before the first scan is
// refused (kubelet retries) rather than prepared against no cards.
func TestPrepareBeforeDiscovery(t *testing.T) {
	d := &Driver{Node: node, CDIDir: t.TempDir()}
	c := claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "1Gi", "10")})
	got, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err := got[c.UID].Err; err == nil || !strings.Contains(err.Error(), "has not discovered") {
		t.Errorf("error %v, want the cards not discovered yet", err)
	}
}

func TestUnprepare(t *testing.T) {
	cfg := enforce.DefaultConfig()
	cfg.Paths.HostCacheDir = t.TempDir()
	d := &Driver{Node: node, Enforce: cfg, CDIDir: t.TempDir()}
	d.Update(testCards)
	c := claim([]resourceapi.DeviceRequestAllocationResult{result("gpu", "gpu-0", "1Gi", "10")})
	if got, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c}); got[c.UID].Err != nil {
		t.Fatal(got[c.UID].Err)
	}
	for range 2 { // idempotent: the second finds nothing to remove
		got, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID("uid-1")}})
		if err != nil || got["uid-1"] != nil {
			t.Fatalf("unprepare: %v, %v", got, err)
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(d.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if devs := cache.ListDevices(); len(devs) != 0 {
		t.Errorf("CDI devices left after unprepare: %v", devs)
	}
	if left, _ := os.ReadDir(cfg.Paths.HostCacheDir); len(left) != 0 {
		t.Errorf("shared regions left after unprepare: %v", left)
	}
}

// TestResources checks the published devices against the cards: one per
// card in index order, capacities with the extended resources' ranges and
// defaults of a whole card, and a taint on the card out of service.
func TestResources(t *testing.T) {
	res := resources(node, testCards, nil)
	pool, ok := res.Pools[node]
	if !ok || len(pool.Slices) != 1 {
		t.Fatalf("pools %+v, want one slice in pool %s", res.Pools, node)
	}
	type summary struct {
		Name, UUID, Memory, MemoryMin, MemoryDefault, Cores, CoresMin, CoresDefault string
		Shared                                                                      bool
		Taints                                                                      int
	}
	var got []summary
	for _, d := range pool.Slices[0].Devices {
		m, c := d.Capacity["memory"], d.Capacity["cores"]
		got = append(got, summary{
			Name: d.Name, UUID: *d.Attributes["uuid"].StringValue,
			Memory: m.Value.String(), MemoryMin: m.RequestPolicy.ValidRange.Min.String(), MemoryDefault: m.RequestPolicy.Default.String(),
			Cores: c.Value.String(), CoresMin: c.RequestPolicy.ValidRange.Min.String(), CoresDefault: c.RequestPolicy.Default.String(),
			Shared: *d.AllowMultipleAllocations, Taints: len(d.Taints),
		})
	}
	card := func(name, uuid string, taints int) summary {
		return summary{name, uuid, "23034Mi", "1Mi", "23034Mi", "100", "0", "100", true, taints}
	}
	want := []summary{card("gpu-0", "GPU-aaa", 0), card("gpu-1", "GPU-bbb", 0), card("gpu-2", "GPU-ccc", 1)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices (-want,+got):\n%s", diff)
	}
}
