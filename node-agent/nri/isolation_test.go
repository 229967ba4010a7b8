package nri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// claimPod is a pod on node-1 whose container main uses the ResourceClaim
// claim (and asks for no extended resource).
func claimPod(name, claim string) *v1.Pod {
	p := st.MakePod().Name(name).Namespace("ns").UID("uid-" + name).Node("node-1").Container("main").Obj()
	p.Spec.Containers[0].Name = "main" // as the runtime side names it
	p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
	return p
}

// allocatedClaim is a claim of driver on node-1's pool (card device
// gpu-<index>, 8 GiB and 50 % of it), reserved for pod.
func allocatedClaim(name, driver string, index int, pod string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("cuid-" + name)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: driver, Pool: "node-1", Device: fmt.Sprint("gpu-", index),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{gpuinfo.DRAMemory: resource.MustParse("8Gi"), gpuinfo.DRACores: resource.MustParse("50")},
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("uid-" + pod)}},
		},
	}
}

func claimGetter(claims ...*resourceapi.ResourceClaim) func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	return func(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
		for _, c := range claims {
			if c.Namespace == namespace && c.Name == name {
				return c, nil
			}
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
}

// cardNode is card minor's device node, as a CDI spec of the NVIDIA
// toolkit gives it.
func cardNode(minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{Path: fmt.Sprint("/dev/nvidia", minor), Type: "c", Major: 195, Minor: minor}
}

func withDevices(env []string, devices ...*api.LinuxDevice) *api.Container {
	return &api.Container{Env: env, Linux: &api.LinuxContainer{Devices: devices}}
}

// TestNRIClaimsAndDevices: through NRI's runtime side, a container without
// an assignment keeps its claim's cards only for a Tessera claim allocated
// here and reserved for its pod; a claim of another driver opens no card;
// and any GPU device node a container was not given — by a CDI name, an
// annotation, an alias — stops it.
func TestNRIClaimsAndDevices(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	plugin.SetPods(podMap(
		claimPod("tessera", "tessera-claim"), claimPod("nic", "nic-claim"), claimPod("stolen", "tessera-claim"),
		gpuPod("assigned", 1), st.MakePod().Name("plain").Namespace("ns").UID("uid-plain").Node("node-1").Container("main").Obj(),
	))
	plugin.Claims = claimGetter(allocatedClaim("tessera-claim", gpuinfo.DRADriver, 2, "tessera"), allocatedClaim("nic-claim", "nic.example.com", 2, "nic"))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)

	all := []*api.LinuxDevice{cardNode(0), cardNode(1), cardNode(2), {Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255}}
	imageEnv := []string{"NVIDIA_VISIBLE_DEVICES=all"}
	for _, tc := range []struct {
		name, pod string
		ctr       *api.Container
		wantEnv   map[string]string // the adjustment's environment; nil: none
		wantErr   string
	}{
		{name: "a Tessera claim, with its card's device node: left to the claim", pod: "tessera", ctr: withDevices(imageEnv, cardNode(2))},
		{name: "a Tessera claim with another card's node", pod: "tessera", ctr: withDevices(imageEnv, cardNode(2), cardNode(0)), wantErr: "device /dev/nvidia0 (card minor 0), which is not a card it was assigned"},
		{name: "a claim of another driver over an image asking for every card", pod: "nic", ctr: withDevices(imageEnv), wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
		{name: "another pod's Tessera claim", pod: "stolen", ctr: withDevices(imageEnv), wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}},
		{name: "every card by a CDI name, without an assignment", pod: "plain", ctr: withDevices(imageEnv, all...), wantErr: "device /dev/nvidia0 (card minor 0), which is not a card it was assigned"},
		{name: "a control device alone, without an assignment", pod: "plain", ctr: withDevices(nil, all[3]), wantErr: "the GPU device /dev/nvidiactl but was assigned no card"},
		{name: "an assignment with another card's node under an alias", pod: "assigned", ctr: withDevices(nil, &api.LinuxDevice{Path: "/dev/gpu-alias", Type: "c", Major: 195, Minor: 3}), wantErr: "device /dev/gpu-alias (card minor 3)"},
		{name: "an assignment, no device nodes: its card comes as a CDI device", pod: "assigned", ctr: withDevices(nil), wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj, err := runtime.createWith(tCtx, "ns", tc.pod, "uid-"+tc.pod, tc.ctr)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			got := env(adj)
			for k, v := range tc.wantEnv {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (adjustment %v)", k, got[k], v, adj)
				}
			}
			if tc.wantEnv == nil && len(got) != 0 {
				t.Errorf("the container was adjusted: %v", adj)
			}
			runtime.stop(tCtx, tc.pod)
		})
	}
}

// TestNRILiveShares: the shares held on a card are those of the containers
// the runtime runs — found running when the plugin connects, read from
// their environment, or created since — and a container whose share would
// over-commit a card is refused until another stops. The containers of one
// claim hold its share once.
func TestNRILiveShares(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	// Found running: a 60 GiB share of card 0, a whole card 1, and two
	// containers of one claim on card 2.
	running := []*api.Container{
		{Id: "ctr-old", PodSandboxId: "sb-old", Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=61440m", "CUDA_DEVICE_SM_LIMIT_0=50"}},
		{Id: "ctr-whole", PodSandboxId: "sb-whole", Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-1"}},
		{Id: "ctr-c1", PodSandboxId: "sb-c", Name: "a", Env: []string{"TESSERA_CLAIM=cuid-1", "NVIDIA_VISIBLE_DEVICES=GPU-2", "CUDA_DEVICE_MEMORY_LIMIT_0=40960m", "CUDA_DEVICE_SM_LIMIT_0=50"}},
		{Id: "ctr-c2", PodSandboxId: "sb-c", Name: "b", Env: []string{"TESSERA_CLAIM=cuid-1", "NVIDIA_VISIBLE_DEVICES=GPU-2", "CUDA_DEVICE_MEMORY_LIMIT_0=40960m", "CUDA_DEVICE_SM_LIMIT_0=50"}},
	}
	runtime := startRuntime(t, dir, running...)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	plugin.stop = func(*api.Container) error { return nil } // no pods: the audit would stop them all
	var mu sync.Mutex
	var told []string
	plugin.Refused = func(pod *v1.Pod, container, reason string) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, pod.Name+"/"+container)
	}
	plugin.SetPods(podMap(
		sharePod("big", 0, 30720, 25), sharePod("small", 0, 20480, 50), sharePod("on-whole", 1, 1024, 0),
		sharePod("beside-claim", 2, 40960, 50), sharePod("victim", 3, 61440, 50), sharePod("preemptor", 3, 40960, 50),
	))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)

	create := func(pod string) error {
		_, err := runtime.create(tCtx, "ns", pod, "uid-"+pod)
		return err
	}
	overCommitted := "would be over-committed"
	testutil.CheckError(t, create("big"), "card 0 (GPU-0) would be over-committed: the containers running on it hold 61440 of its 81920 MiB and 50 % of its compute, and this container adds 30720 MiB and 25 %")
	testutil.CheckError(t, create("small"), "")                // 60 + 20 GiB fit
	testutil.CheckError(t, create("on-whole"), overCommitted)  // a card held whole
	testutil.CheckError(t, create("beside-claim"), "")         // the claim's 40 GiB counted once
	testutil.CheckError(t, create("victim"), "")               // alone on card 3
	testutil.CheckError(t, create("preemptor"), overCommitted) // the victim still runs
	testutil.CheckError(t, create("preemptor"), overCommitted) // kubelet retries: told once
	mu.Lock()
	if diff := cmp.Diff([]string{"big/main", "on-whole/main", "preemptor/main"}, told); diff != "" {
		t.Errorf("refusals told (-want,+got):\n%s", diff)
	}
	mu.Unlock()
	runtime.stop(tCtx, "victim")
	testutil.CheckError(t, create("preemptor"), "") // once it has stopped
	runtime.stop(tCtx, "old")
	testutil.CheckError(t, create("big"), "") // the share found running is gone
}

// TestNRIRegions: a shared container's region is created, empty, before it
// starts, is mounted into it alone, and is removed with the container.
func TestNRIRegions(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	plugin.SetPods(podMap(gpuPod("p0", 0), gpuPod("p1", 0)))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)
	cacheDir := plugin.Enforce.Paths.HostCacheDir
	for _, pod := range []string{"p0", "p1"} {
		adj, err := runtime.create(tCtx, "ns", pod, "uid-"+pod)
		if err != nil {
			t.Fatal(err)
		}
		region := filepath.Join(cacheDir, "ctr-"+pod+".cache")
		if info, err := os.Stat(region); err != nil || info.Size() != 0 {
			t.Errorf("pod %s: region %v, %v; want an empty file", pod, info, err)
		}
		var sources []string
		for _, m := range adj.GetMounts() {
			if strings.HasPrefix(m.Source, cacheDir) {
				sources = append(sources, m.Source+" -> "+m.Destination)
			}
		}
		if want := region + " -> /usr/local/vgpu/cache/ctr-" + pod + ".cache"; len(sources) != 1 || sources[0] != want {
			t.Errorf("pod %s: cache mounts %v, want only %s", pod, sources, want)
		}
		if e := env(adj)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]; e != "/usr/local/vgpu/cache/ctr-"+pod+".cache" {
			t.Errorf("pod %s: CUDA_DEVICE_MEMORY_SHARED_CACHE = %q", pod, e)
		}
	}
	runtime.stop(tCtx, "p0")
	runtime.remove(tCtx, "p0")
	if _, err := os.Stat(filepath.Join(cacheDir, "ctr-p0.cache")); !os.IsNotExist(err) {
		t.Errorf("the removed container's region is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cacheDir, "ctr-p1.cache")); err != nil {
		t.Errorf("another container's region went with it: %v", err)
	}
}

// TestNRIAuditsOnConnecting: containers the runtime created while the
// plugin was away are found when it connects: each that may see a card is
// stopped and told of; one that cannot be stopped keeps the node not ready
// until the runtime says it stopped; those running as enforcement has them
// (by this agent or an earlier one) are left alone.
func TestNRIAuditsOnConnecting(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	running := []*api.Container{
		// Adjusted by an earlier agent, which mounted the whole cache and a
		// lock directory: its cards, limits and library are right. First,
		// so that reporting it would crowd out one of the three below.
		{Id: "ctr-older", PodSandboxId: "sb-older", Name: "main", Pid: 4141, Env: []string{
			"NVIDIA_VISIBLE_DEVICES=GPU-2", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=25",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache/uid-older_main.cache", "CUDA_TASK_PRIORITY=1",
		}, Mounts: []*api.Mount{
			{Source: "/usr/local/vgpu/libvgpu.so", Destination: "/usr/local/vgpu/libvgpu.so"},
			{Source: "/usr/local/vgpu/ld.so.preload", Destination: "/etc/ld.so.preload"},
			{Source: "/var/lib/tessera/vgpu-cache", Destination: "/usr/local/vgpu/cache"},
			{Source: "/tmp/vgpulock", Destination: "/tmp/vgpulock"},
		}},
		// An image's NVIDIA_VISIBLE_DEVICES=all, never adjusted.
		{Id: "ctr-escapee", PodSandboxId: "sb-escapee", Name: "main", Pid: 4242, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		{Id: "ctr-unstoppable", PodSandboxId: "sb-unstoppable", Name: "main", Pid: 4343, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		// A container without GPUs as the agent makes it.
		{Id: "ctr-plain", PodSandboxId: "sb-plain", Name: "main", Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"}},
		// No card, but no pod in the API either.
		{Id: "ctr-orphan", PodSandboxId: "sb-orphan", Name: "main", Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
	}
	runtime := startRuntime(t, dir, running...)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	var mu sync.Mutex
	var stopped []string
	plugin.stop = func(ctr *api.Container) error {
		mu.Lock()
		defer mu.Unlock()
		if ctr.GetId() == "ctr-unstoppable" {
			return fmt.Errorf("process %d is no longer the container's", ctr.GetPid())
		}
		stopped = append(stopped, ctr.GetId())
		return nil
	}
	reported := make(chan Unenforced, 10)
	plugin.Unenforced = func(u Unenforced) { reported <- u }
	plain := st.MakePod().Name("plain").Namespace("ns").UID("uid-plain").Node("node-1").Container("main").Obj()
	plugin.SetPods(podMap(gpuPod("escapee", 0), gpuPod("unstoppable", 1), gpuPod("older", 2), plain))
	runPlugin(tCtx, plugin, dir)

	got := map[string]Unenforced{}
	for len(got) < 3 {
		select {
		case u := <-reported:
			got[u.PodName] = u
		case <-tCtx.Done():
			t.Fatalf("reported %v, want three containers", got)
		}
	}
	for name, want := range map[string]struct{ holds, stopped bool }{"escapee": {true, true}, "unstoppable": {true, false}, "orphan": {false, false}} {
		u := got[name]
		if u.HoldsGPU != want.holds || u.Stopped != want.stopped || u.Reason == "" {
			t.Errorf("pod %s: %+v, want holds %t, stopped %t, a reason", name, u, want.holds, want.stopped)
		}
	}
	if r := got["escapee"].Reason; !strings.Contains(r, `NVIDIA_VISIBLE_DEVICES="all", not "GPU-0"`) {
		t.Errorf("the escapee's reason = %q", r)
	}
	if diff := cmp.Diff([]string{"ctr-escapee"}, stopped); diff != "" {
		t.Errorf("stopped (-want,+got):\n%s", diff)
	}
	waitReady(tCtx, plugin, false)
	if r := plugin.NotReady(); !strings.Contains(r, "1 container(s) created while the agent could not enforce") {
		t.Errorf("NotReady = %q", r)
	}
	// The runtime tells it stopped (again, until the runtime has finished
	// adding the plugin, which the audit may beat).
	if err := wait.PollUntilContextTimeout(tCtx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		runtime.stop(tCtx, "unstoppable")
		return plugin.NotReady() == "", nil
	}); err != nil {
		t.Errorf("still not ready once the container stopped: %s", plugin.NotReady())
	}
}
