package gpuinfo_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestParsePodRequest(t *testing.T) {
	tessera := gpuinfo.DefaultResourceNames()
	tests := []struct {
		name    string
		pod     *v1.Pod
		names   gpuinfo.ResourceNames
		want    *gpuinfo.PodRequest
		wantErr string
	}{
		{
			name: "no GPU request",
			pod:  st.MakePod().Name("p").Lim(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj(),
			want: nil,
		},
		{
			name: "memory and cores on one card",
			pod:  st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "4096", "tessera.io/gpu-cores": "30"}).Obj(),
			want: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 4096, Cores: 30}}},
		},
		{
			name: "requests accepted without limits",
			pod:  st.MakePod().Name("p").Req(map[v1.ResourceName]string{"tessera.io/gpu-memory-percent": "25"}).Obj(),
			want: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryPercent: 25}}},
		},
		{
			name: "only a card count is whole exclusive cards",
			pod:  st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "4"}).Obj(),
			want: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 4, Cores: 100}}},
		},
		{
			name: "init, sidecar and app containers keep their kinds and order",
			pod: st.MakePod().Name("p").
				InitReq(map[v1.ResourceName]string{"tessera.io/gpu-memory": "1000"}).
				SidecarReq(map[v1.ResourceName]string{"tessera.io/gpu-memory": "2000"}).
				Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "3000"}).Obj(),
			want: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
				{Name: "init-con0", Kind: gpuinfo.InitContainer, Count: 1, MemoryMiB: 1000},
				{Name: "sidecar-con1", Kind: gpuinfo.SidecarContainer, Count: 1, MemoryMiB: 2000},
				{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 3000},
			}},
		},
		{
			name:  "HAMi names",
			pod:   st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "50"}).Obj(),
			names: gpuinfo.HAMiResourceNames(),
			want:  &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 2, MemoryMiB: 8000, Cores: 50}}},
		},
		{
			name: "selectors are parsed and lower-cased",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.ModelAnnotation, "A100, H100").Annotation(gpuinfo.UUIDExcludeAnnotation, "GPU-X").Obj(),
			want: &gpuinfo.PodRequest{
				Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, Cores: 100}},
				Selector:   gpuinfo.Selector{Models: []string{"a100", "h100"}, ExcludeUUIDs: []string{"gpu-x"}},
			},
		},
		{
			name:    "memory and percent together",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "1", "tessera.io/gpu-memory-percent": "10"}).Obj(),
			wantErr: `container "con0": resource tessera.io/gpu-memory-percent: cannot be combined with tessera.io/gpu-memory`,
		},
		{
			name:    "cores above 100",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-cores": "101"}).Obj(),
			wantErr: `container "con0": resource tessera.io/gpu-cores: must be a whole percentage from 0 to 100, got 101`,
		},
		{
			name:    "memory larger than any card",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "2000000"}).Obj(),
			wantErr: `container "con0": resource tessera.io/gpu-memory: 2000000 MiB is more than any card has`,
		},
		{
			name:    "zero cards",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "0"}).Obj(),
			wantErr: `container "con0": resource tessera.io/gpu: must be a whole number of cards, at least 1, got 0`,
		},
		{
			name:    "negative cards",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "-2"}).Obj(),
			wantErr: `resource tessera.io/gpu: must be a whole number of cards, at least 1, got -2`,
		},
		{
			name:    "fractional cards",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "500m"}).Obj(),
			wantErr: `got 500m`,
		},
		{
			name:    "percent out of range",
			pod:     st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory-percent": "0"}).Obj(),
			wantErr: `resource tessera.io/gpu-memory-percent: must be a whole percentage from 1 to 100, got 0`,
		},
		{
			name: "empty selector annotation",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.ModelAnnotation, " , ").Obj(),
			wantErr: `annotation tessera.io/gpu-model: must list at least one value`,
		},
		{
			name: "task priority",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "1024"}).
				Annotation(gpuinfo.TaskPriorityAnnotation, "low").Obj(),
			want: &gpuinfo.PodRequest{
				Containers:   []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 1024}},
				TaskPriority: gpuinfo.TaskPriorityLow,
			},
		},
		{
			name: "invalid task priority",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "1024"}).
				Annotation(gpuinfo.TaskPriorityAnnotation, "High").Obj(),
			wantErr: `annotation tessera.io/gpu-task-priority: must be "high" or "low", got "High"`,
		},
		{
			name: "a MIG slice of one's own is held whole",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "10000"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Obj(),
			want: &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 10000, Cores: 100}}},
		},
		{
			name: "a MIG slice without memory: any free slice",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Obj(),
			want: &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, Cores: 100}}},
		},
		{
			name: "a memory share inside a MIG slice",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig-shared").Obj(),
			want: &gpuinfo.PodRequest{Isolation: gpuinfo.MIGSliceShare, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 5000}}},
		},
		{
			name: "four cards linked by NVLink",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "4"}).
				Annotation(gpuinfo.TopologyAnnotation, "nvlink").Obj(),
			want: &gpuinfo.PodRequest{Topology: gpuinfo.LinkNVLink, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 4, Cores: 100}}},
		},
		{
			name: "any link, the default",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "2"}).
				Annotation(gpuinfo.TopologyAnnotation, "any").Obj(),
			want: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 2, Cores: 100}}},
		},
		{
			name: "unknown topology",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "2"}).
				Annotation(gpuinfo.TopologyAnnotation, "NVLINK").Obj(),
			wantErr: `annotation tessera.io/gpu-topology: must be "nvlink", "pcie-switch", "numa-node" or "any", got "NVLINK"`,
		},
		{
			name: "unknown isolation",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000"}).
				Annotation(gpuinfo.IsolationAnnotation, "MIG").Obj(),
			wantErr: `annotation tessera.io/gpu-isolation: must be "mig" or "mig-shared", got "MIG"`,
		},
		{
			name: "two MIG slices for one container",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "2"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Obj(),
			wantErr: `container "con0": resource tessera.io/gpu: a container gets one MIG slice (a CUDA process sees one), got 2 (annotation tessera.io/gpu-isolation: mig)`,
		},
		{
			name: "a MIG slice by percentage",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory-percent": "50"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Obj(),
			wantErr: `container "con0": resource tessera.io/gpu-memory-percent: a MIG request gives its memory in MiB (tessera.io/gpu-memory)`,
		},
		{
			name: "part of a MIG slice's compute",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000", "tessera.io/gpu-cores": "50"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Obj(),
			wantErr: `resource tessera.io/gpu-cores: a MIG slice is held whole`,
		},
		{
			name: "compute limited inside a MIG slice",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "5000", "tessera.io/gpu-cores": "20"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig-shared").Obj(),
			wantErr: `resource tessera.io/gpu-cores: compute inside a MIG slice cannot be limited`,
		},
		{
			name: "a share inside a MIG slice without memory",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig-shared").Obj(),
			wantErr: `resource tessera.io/gpu-memory: a share inside a MIG slice needs its memory in MiB`,
		},
		{
			name: "HAMi's MIG mode is a slice of one's own",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}).
				Annotation(gpuinfo.HAMiModeAnnotation, "mig").Obj(),
			names: gpuinfo.HAMiResourceNames(),
			want:  &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 8000, Cores: 100}}},
		},
		{
			name: "HAMi's hami-core mode is a shared card",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}).
				Annotation(gpuinfo.HAMiModeAnnotation, "hami-core").Obj(),
			names: gpuinfo.HAMiResourceNames(),
			want:  &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 8000}}},
		},
		{
			name: "HAMi's MPS mode is refused",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}).
				Annotation(gpuinfo.HAMiModeAnnotation, "mps").Obj(),
			wantErr: `annotation nvidia.com/vgpu-mode: must be "hami-core" or "mig" (Tessera has no MPS), got "mps"`,
		},
		{
			name: "Tessera's annotation wins over HAMi's",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu-memory": "8000"}).
				Annotation(gpuinfo.HAMiModeAnnotation, "mig").Annotation(gpuinfo.IsolationAnnotation, "mig-shared").Obj(),
			want: &gpuinfo.PodRequest{Isolation: gpuinfo.MIGSliceShare, Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, MemoryMiB: 8000}}},
		},
		{
			name: "a MIG profile by name",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Annotation(gpuinfo.MIGProfileAnnotation, "3g.40gb").Obj(),
			want: &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, MIGProfile: "3g.40gb", Containers: []gpuinfo.ContainerRequest{{Name: "con0", Kind: gpuinfo.AppContainer, Count: 1, Cores: 100}}},
		},
		{
			name: "a MIG profile without MIG",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.MIGProfileAnnotation, "3g.40gb").Obj(),
			wantErr: "annotation tessera.io/gpu-mig-profile: needs tessera.io/gpu-isolation: mig or mig-shared",
		},
		{
			name: "a MIG profile name with a slash",
			pod: st.MakePod().Name("p").Lim(map[v1.ResourceName]string{"tessera.io/gpu": "1"}).
				Annotation(gpuinfo.IsolationAnnotation, "mig").Annotation(gpuinfo.MIGProfileAnnotation, "3g/40gb").Obj(),
			wantErr: `annotation tessera.io/gpu-mig-profile: "3g/40gb" is not a MIG profile name such as 1g.10gb`,
		},
		{
			name: "task priority on a pod without GPUs is not read",
			pod:  st.MakePod().Name("p").Annotation(gpuinfo.TaskPriorityAnnotation, "urgent").Obj(),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			names := tc.names
			if names == (gpuinfo.ResourceNames{}) {
				names = tessera
			}
			got, err := gpuinfo.ParsePodRequest(tc.pod, names)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestMemoryOn(t *testing.T) {
	tests := []struct {
		name string
		req  gpuinfo.ContainerRequest
		want int64
	}{
		{"fixed", gpuinfo.ContainerRequest{MemoryMiB: 4096}, 4096},
		{"percent", gpuinfo.ContainerRequest{MemoryPercent: 25}, 20480},
		{"whole card", gpuinfo.ContainerRequest{Cores: 100}, 81920},
		{"cores only takes the whole memory", gpuinfo.ContainerRequest{Cores: 30}, 81920},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.req.MemoryOn(81920); got != tc.want {
				t.Errorf("MemoryOn(81920) = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSelectorMatches(t *testing.T) {
	sel, err := gpuinfo.ParseSelector(map[string]string{
		gpuinfo.ModelAnnotation:        "a100",
		gpuinfo.ModelExcludeAnnotation: "40GB",
		gpuinfo.UUIDExcludeAnnotation:  "GPU-bad",
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		model, uuid string
		want        bool
	}{
		{"nvidia a100-sxm4-80gb", "gpu-1", true},
		{"nvidia a100-sxm4-40gb", "gpu-2", false},
		{"nvidia h100", "gpu-3", false},
		{"nvidia a100-sxm4-80gb", "gpu-bad", false},
	}
	for _, tc := range tests {
		if got := sel.Matches(tc.model, tc.uuid); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", tc.model, tc.uuid, got, tc.want)
		}
	}
	if got, want := sel.String(), "model a100, model not 40gb, UUID not gpu-bad"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
