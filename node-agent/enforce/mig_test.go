package enforce

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// migTestNode is node-1 whose card 1 is in MIG mode with a 3g.40gb slice at
// slot 4 (MIG device 0) and a 1g.10gb slice at slot 0 (MIG device 1).
func migTestNode() Node {
	n := testNode()
	c := &n.Cards[1]
	c.MIGEnabled = true
	c.MIG = &gpuinfo.MIG{Slots: 8, Profiles: []gpuinfo.MIGProfile{
		{Name: "1g.10gb", Slices: 1, Size: 1, MemoryMiB: 9856, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
		{Name: "3g.40gb", ID: 2, Slices: 3, Size: 4, MemoryMiB: 40192, Starts: []int{0, 4}},
	}, Instances: []gpuinfo.MIGInstance{
		{Profile: "3g.40gb", Start: 4, UUID: "MIG-a", Index: 0, Healthy: true},
		{Profile: "1g.10gb", Start: 0, UUID: "MIG-b", Index: 1, Healthy: true},
	}}
	return n
}

func migPod(isolation string, limits map[v1.ResourceName]string, assignment string) *v1.Pod {
	p := pod(limits, assignment)
	p.Annotations[gpuinfo.IsolationAnnotation] = isolation
	return p
}

// TestForMIGSlices: a container with a MIG slice sees that MIG device only,
// by its UUID and as its CDI device; a slice of its own gets no
// interception, a share inside one a memory limit and no compute limit; an
// assignment naming a slice the card does not have as named is refused, and
// so is a card in MIG mode given whole.
func TestForMIGSlices(t *testing.T) {
	cfg := DefaultConfig()
	own := `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0,"uuid":"MIG-b"}}]}}`
	// shareEnv is the environment of a 5000 MiB share in slice MIG-a.
	shareEnv := []EnvVar{
		{"NVIDIA_VISIBLE_DEVICES", "MIG-a"},
		{"CUDA_DEVICE_MEMORY_LIMIT_0", "5000m"}, {"CUDA_DEVICE_SM_LIMIT_0", "0"},
		{"CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/cache/ctr-1.cache"},
		{"CUDA_TASK_PRIORITY", "1"}, {"TESSERA_CLAIM", ""},
	}
	shared := `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":5000,"cores":0,"mig":{"profile":"3g.40gb","start":4,"uuid":"MIG-a"}}]}}`
	tests := []struct {
		name    string
		pod     *v1.Pod
		naming  CDINaming
		wantEnv []EnvVar
		wantCDI []string
		wantErr string
		// dynamic marks card 1 dynamic.
		dynamic bool
	}{
		{
			name:    "a slice of its own: the MIG device alone, no interception",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, own),
			wantEnv: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "MIG-b"}, {"TESSERA_CLAIM", ""}},
			wantCDI: []string{"nvidia.com/gpu=1:1"},
		},
		{
			name:    "by UUID, the CDI device is the MIG device's UUID",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, own),
			naming:  CDIByUUID,
			wantEnv: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "MIG-b"}, {"TESSERA_CLAIM", ""}},
			wantCDI: []string{"nvidia.com/gpu=MIG-b"},
		},
		{
			name:    "a share inside a slice: a memory limit, compute unlimited",
			pod:     migPod("mig-shared", map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000"}, shared),
			wantEnv: shareEnv,
			wantCDI: []string{"nvidia.com/gpu=1:0"},
		},
		{
			name:    "its owner switching the pod to a slice of its own after placement changes nothing",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000"}, shared),
			wantEnv: shareEnv,
			wantCDI: []string{"nvidia.com/gpu=1:0"},
		},
		{
			name:    "a slice the card does not have",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":3,"uuid":"MIG-b"}}]}}`),
			wantErr: "card 1 (GPU-1) has no MIG slice 1g.10gb at slot 3",
		},
		{
			name:    "another slice's MIG device",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0,"uuid":"MIG-a"}}]}}`),
			wantErr: `card 1: its MIG slice 1g.10gb at slot 0 is MIG-b, not "MIG-a"`,
		},
		{
			name:    "a static slice named without its device",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0}}]}}`),
			wantErr: "the assignment names no MIG device for slice 1g.10gb at slot 0, and the card is not dynamic",
		},
		{
			name:    "a dynamic card's slice made for the pod, whatever its device",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0}}]}}`),
			dynamic: true,
			wantEnv: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "MIG-b"}, {"TESSERA_CLAIM", ""}},
			wantCDI: []string{"nvidia.com/gpu=1:1"},
		},
		{
			name:    "a dynamic card's slice made again under another device",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0,"uuid":"MIG-gone"}}]}}`),
			dynamic: true,
			wantEnv: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "MIG-b"}, {"TESSERA_CLAIM", ""}},
			wantCDI: []string{"nvidia.com/gpu=1:1"},
		},
		{
			name:    "more memory than the slice",
			pod:     migPod("mig-shared", map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000"}, `{"version":2,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":20000,"cores":0,"mig":{"profile":"1g.10gb","start":0,"uuid":"MIG-b"}}]}}`),
			wantErr: "card 1, MIG slice 1g.10gb (MIG-b): 20000 MiB is more than the slice's 9856 MiB",
		},
		{
			name:    "the card in MIG mode given whole",
			pod:     pod(map[v1.ResourceName]string{"tessera.io/gpu": "1"}, `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":81920,"cores":100}]}}`),
			wantErr: "card 1 (GPU-1) is in MIG mode: only its MIG slices can be given",
		},
		{
			name:    "a slice in an assignment of version 1",
			pod:     migPod("mig", map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}, `{"version":1,"containers":{"con0":[{"index":1,"uuid":"GPU-1","memoryMiB":9856,"cores":100,"mig":{"profile":"1g.10gb","start":0,"uuid":"MIG-b"}}]}}`),
			wantErr: "mig: needs assignment version 2",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cfg
			if tc.naming != "" {
				cfg.CDINames = tc.naming
			}
			node := migTestNode()
			node.Cards[1].MIGDynamic = tc.dynamic
			got, err := cfg.For(tc.pod, "uid-1", "con0", "ctr-1", node)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.wantEnv, got.Env); diff != "" {
				t.Errorf("environment (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCDI, got.CDIDevices); diff != "" {
				t.Errorf("CDI devices (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestSliceLookup: a card's slice is found by profile and start alone.
func TestSliceLookup(t *testing.T) {
	c := migTestNode().Cards[1]
	if in, p := c.Slice("3g.40gb", 4); in == nil || in.UUID != "MIG-a" || p.MemoryMiB != 40192 {
		t.Errorf("Slice(3g.40gb, 4) = %+v, %+v", in, p)
	}
	if in, _ := c.Slice("3g.40gb", 0); in != nil {
		t.Errorf("Slice(3g.40gb, 0) = %+v, want none", in)
	}
	var whole discovery.Card
	if in, _ := whole.Slice("1g.10gb", 0); in != nil {
		t.Errorf("a card not in MIG mode has slice %+v", in)
	}
}
