package enforce

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func pod(limits map[v1.ResourceName]string, assignment string) *v1.Pod {
	return podWith(limits, assignment, nil, "")
}

// podWith is pod with a priority (nil: none) and a task priority annotation
// ("": none).
func podWith(limits map[v1.ResourceName]string, assignment string, priority *int32, taskPriority string) *v1.Pod {
	p := st.MakePod().Name("p").Namespace("ns").UID("uid-1").Node("node-1").Lim(limits).
		Lim(map[v1.ResourceName]string{v1.ResourceCPU: "1"})
	if assignment != "" {
		p.Annotation(gpuinfo.AssignmentAnnotation, assignment)
	}
	if priority != nil {
		p.Priority(*priority)
	}
	if taskPriority != "" {
		p.Annotation(gpuinfo.TaskPriorityAnnotation, taskPriority)
	}
	return p.Obj()
}

// testCards are node-1's cards: index i is GPU-i, 80 GiB.
func testCards() []discovery.Card {
	var cards []discovery.Card
	for i := 0; i < 4; i++ {
		cards = append(cards, discovery.Card{Index: i, Minor: i, UUID: fmt.Sprint("GPU-", i), MemoryMiB: 81920, Healthy: true})
	}
	return cards
}

// testNode is node-1 with testCards and no claims.
func testNode() Node { return Node{Name: "node-1", Cards: testCards()} }

func TestFor(t *testing.T) {
	cfg := Config{Names: gpuinfo.DefaultResourceNames(), Paths: DefaultPaths(), HighTaskPriority: 1000}
	// The container's own shared region, and nothing of its neighbours'.
	mounts := []Mount{
		{Source: "/usr/local/vgpu/libvgpu.so", Destination: "/usr/local/vgpu/libvgpu.so", ReadOnly: true},
		{Source: "/usr/local/vgpu/ld.so.preload", Destination: "/etc/ld.so.preload", ReadOnly: true},
		{Source: "/var/lib/tessera/vgpu-cache/ctr-1.cache", Destination: "/usr/local/vgpu/cache/ctr-1.cache"},
	}
	gpu1 := []gpuinfo.CardAssignment{{Index: 1, UUID: "GPU-1", MemoryMiB: 4096, Cores: 30}}
	// oneCard is the adjustment of a container with card GPU-1 (4096 MiB,
	// 30 cores) at the given task priority.
	oneCard := func(taskPriority string) *Adjustment {
		return &Adjustment{Env: []EnvVar{
			{"NVIDIA_VISIBLE_DEVICES", "GPU-1"},
			{"CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"}, {"CUDA_DEVICE_SM_LIMIT_0", "30"},
			{"CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/cache/ctr-1.cache"},
			{"GPU_CORE_UTILIZATION_POLICY", "force"},
			{"CUDA_TASK_PRIORITY", taskPriority}, {"TESSERA_CLAIM", ""},
		}, Mounts: mounts, Region: "ctr-1.cache", Holdings: []Holding{{Key: "container/ctr-1", Cards: gpu1}}}
	}
	share := `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":4096,"cores":30},{"index":3,"uuid":"GPU-3","memoryMiB":4096,"cores":30}]}}`
	one := `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":4096,"cores":30}]}}`
	whole := `{"version":1,"containers":{"con0":[{"index":2,"uuid":"GPU-2","memoryMiB":81920,"cores":100}]}}`
	tests := []struct {
		name      string
		pod       *v1.Pod
		container string
		uid, node string
		cards     []discovery.Card
		want      *Adjustment
		wantErr   string
	}{
		{
			name: "shared cards get limits and the interception library",
			pod:  pod(map[v1.ResourceName]string{"tessera.io/gpu": "2", "tessera.io/gpu-memory": "4096", "tessera.io/gpu-cores": "30"}, share),
			want: &Adjustment{Env: []EnvVar{
				{"NVIDIA_VISIBLE_DEVICES", "GPU-1,GPU-3"},
				{"CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"}, {"CUDA_DEVICE_SM_LIMIT_0", "30"},
				{"CUDA_DEVICE_MEMORY_LIMIT_1", "4096m"}, {"CUDA_DEVICE_SM_LIMIT_1", "30"},
				{"CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/cache/ctr-1.cache"},
				{"GPU_CORE_UTILIZATION_POLICY", "force"},
				{"CUDA_TASK_PRIORITY", "1"}, {"TESSERA_CLAIM", ""},
			}, Mounts: mounts, Region: "ctr-1.cache", Holdings: []Holding{{Key: "container/ctr-1", Cards: []gpuinfo.CardAssignment{
				{Index: 1, UUID: "GPU-1", MemoryMiB: 4096, Cores: 30}, {Index: 3, UUID: "GPU-3", MemoryMiB: 4096, Cores: 30},
			}}}},
		},
		{
			name: "a pod at the high task priority computes first on its shared card",
			pod:  podWith(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096", "tessera.io/gpu-cores": "30"}, one, ptr.To[int32](1000), ""),
			want: oneCard("0"),
		},
		{
			name: "just below the threshold is low",
			pod:  podWith(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096", "tessera.io/gpu-cores": "30"}, one, ptr.To[int32](999), ""),
			want: oneCard("1"),
		},
		{
			name: "the annotation makes a low-priority pod high",
			pod:  podWith(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096"}, one, nil, "high"),
			want: oneCard("0"),
		},
		{
			name: "and a high-priority pod low",
			pod:  podWith(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096"}, one, ptr.To[int32](5000), "low"),
			want: oneCard("1"),
		},
		{
			name:    "an invalid task priority: the container must not start",
			pod:     podWith(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096"}, one, nil, "urgent"),
			wantErr: `pod ns/p: annotation tessera.io/gpu-task-priority: must be "high" or "low", got "urgent"`,
		},
		{
			name: "whole cards get no task priority, whatever the pod's priority",
			pod:  podWith(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole, ptr.To[int32](5000), "high"),
			want: &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "GPU-2"}, {"TESSERA_CLAIM", ""}}, Holdings: []Holding{{Key: "container/ctr-1", Cards: []gpuinfo.CardAssignment{{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Cores: 100}}}}},
		},
		{
			name: "whole cards get only the cards",
			pod:  pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole),
			want: &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "GPU-2"}, {"TESSERA_CLAIM", ""}}, Holdings: []Holding{{Key: "container/ctr-1", Cards: []gpuinfo.CardAssignment{{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Cores: 100}}}}},
		},
		{
			name: "a container without GPUs sees none",
			pod:  pod(nil, ""),
			want: &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "void"}}},
		},
		{
			name:    "a claim the pod does not declare: the container must not start",
			pod:     withClaim(pod(nil, ""), "gpu", ""),
			wantErr: `resource claim "gpu" is not among the pod's spec.resourceClaims`,
		},
		{
			name:    "an assignment naming a card index this node does not have",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, `{"version":1,"containers":{"con0":[{"index":7,"uuid":"GPU-7","memoryMiB":4096,"cores":100}]}}`),
			wantErr: "card 7: node node-1 has no card with that index",
		},
		{
			name:    "an assignment naming a card by another card's index",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, `{"version":1,"containers":{"con0":[{"index":2,"uuid":"GPU-3","memoryMiB":4096,"cores":100}]}}`),
			wantErr: "card 2: its UUID on node node-1 is GPU-2, not GPU-3",
		},
		{
			name:    "an assignment of more memory than the card has",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu-memory": "90000"}, `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":90000,"cores":0}]}}`),
			wantErr: "card 1 (GPU-1): 90000 MiB is more than the card's 81920 MiB",
		},
		{
			name:    "cards not discovered yet: kubelet retries",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole),
			cards:   []discovery.Card{},
			wantErr: "has no card with that index",
		},
		{
			name:      "another container of a GPU pod sees none",
			pod:       pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole),
			container: "sidecar",
			want:      &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "void"}}},
		},
		{
			name:    "no assignment: the container must not start",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, ""),
			wantErr: `container "con0" asks for GPUs but the pod has no tessera.io/gpu-assignment`,
		},
		{
			name:    "invalid assignment",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, `{"version":9}`),
			wantErr: "unsupported version 9",
		},
		{
			name:    "assignment for fewer cards than asked",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "2"}, whole),
			wantErr: `container "con0" asks for 2 GPUs but its assignment lists 1`,
		},
		{
			name:    "a sandbox of another pod with the same name",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole),
			uid:     "uid-2",
			wantErr: "refusing to give GPUs to another pod's container",
		},
		{
			name:    "bound to another node",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole),
			node:    "node-2",
			wantErr: `is bound to node "node-1", not "node-2"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			container, uid, node := "con0", "uid-1", "node-1"
			if tc.container != "" {
				container = tc.container
			}
			if tc.uid != "" {
				uid = tc.uid
			}
			if tc.node != "" {
				node = tc.node
			}
			n := testNode()
			n.Name = node
			if tc.cards != nil {
				n.Cards = tc.cards
			}
			got, err := cfg.For(tc.pod, types.UID(uid), container, "ctr-1", n)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("adjustment (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestWritePreload(t *testing.T) {
	paths := DefaultPaths()
	paths.HostPreload = filepath.Join(t.TempDir(), "vgpu", "ld.so.preload")
	for i := 0; i < 2; i++ { // the second call finds it in place
		if err := paths.WritePreload(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(paths.HostPreload)
	if err != nil || string(got) != "/usr/local/vgpu/libvgpu.so\n" {
		t.Errorf("preload file = %q, %v", got, err)
	}
}

// TestCDIDevices: with a CDI kind, every assigned card — shared or whole —
// is also named as a CDI device, by index or by UUID as the node's spec
// names it; a container without GPUs gets none.
func TestCDIDevices(t *testing.T) {
	share := `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":4096,"cores":30},{"index":3,"uuid":"GPU-3","memoryMiB":4096,"cores":30}]}}`
	whole := `{"version":1,"containers":{"con0":[{"index":2,"uuid":"GPU-2","memoryMiB":81920,"cores":100}]}}`
	for _, tc := range []struct {
		name   string
		naming CDINaming
		pod    *v1.Pod
		want   []string
	}{
		{"shared, by index", CDIByIndex, pod(map[v1.ResourceName]string{"tessera.io/gpu": "2", "tessera.io/gpu-memory": "4096", "tessera.io/gpu-cores": "30"}, share), []string{"nvidia.com/gpu=1", "nvidia.com/gpu=3"}},
		{"whole, by UUID", CDIByUUID, pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, whole), []string{"nvidia.com/gpu=GPU-2"}},
		{"no GPUs", CDIByIndex, pod(nil, ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.CDINames = tc.naming
			got, err := cfg.For(tc.pod, "uid-1", "con0", "ctr-1", testNode())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.CDIDevices); diff != "" {
				t.Errorf("CDI devices (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestCheckEnv: an adjustment is refused when the container's environment
// holds one of its variables twice (image and spec), and only then.
func TestCheckEnv(t *testing.T) {
	adj := &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "GPU-1"}, {"CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"}}}
	for _, tc := range []struct {
		name    string
		env     []string
		wantErr string
	}{
		{name: "none of them", env: []string{"PATH=/bin"}},
		{name: "once, from the image or the spec", env: []string{"NVIDIA_VISIBLE_DEVICES=all", "CUDA_DEVICE_MEMORY_LIMIT_0=81920m"}},
		{name: "another variable twice", env: []string{"PATH=/bin", "PATH=/usr/bin"}},
		{
			name:    "image and spec both set a limit",
			env:     []string{"CUDA_DEVICE_MEMORY_LIMIT_0=1m", "PATH=/bin", "CUDA_DEVICE_MEMORY_LIMIT_0=81920m"},
			wantErr: "the container's environment sets CUDA_DEVICE_MEMORY_LIMIT_0 2 times (its image and its pod spec)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.CheckError(t, adj.CheckEnv(tc.env), tc.wantErr)
		})
	}
}

// TestRegions: a container's shared region is created empty and writable by
// any user of the container (an old one is emptied, so its limits do not
// survive), only as a plain file of the cache directory, and removed.
func TestRegions(t *testing.T) {
	paths := DefaultPaths()
	paths.HostCacheDir = t.TempDir()
	name := RegionName("ctr-1")
	path := filepath.Join(paths.HostCacheDir, name)
	if err := os.WriteFile(path, []byte("an old region's limits"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := paths.CreateRegion(name); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Size() != 0 || info.Mode().Perm() != 0o666 {
		t.Errorf("region = %v, %v; want empty, mode 0666", info, err)
	}
	for _, bad := range []string{"", "../escape.cache", "sub/x.cache", ".hidden"} {
		if err := paths.CreateRegion(bad); err == nil {
			t.Errorf("CreateRegion(%q) succeeded", bad)
		}
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(paths.HostCacheDir, "link.cache")); err != nil {
		t.Fatal(err)
	}
	if err := paths.CreateRegion("link.cache"); err == nil {
		t.Error("CreateRegion followed a symbolic link")
	}
	for i := 0; i < 2; i++ { // gone the second time: no error
		if err := paths.RemoveRegion(name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("region still there: %v", err)
	}
}
