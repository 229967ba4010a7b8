package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// traceDir finds shared/traces/openb beside the repository (as in the
// sessions' and CI's layout).
func traceDir(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		candidate := filepath.Join(dir, "shared", "traces", "openb")
		if _, err := os.Stat(filepath.Join(candidate, "openb_node_list_gpu_node.csv")); err == nil {
			return candidate
		}
	}
	t.Skip("shared/traces/openb not found beside the repository: the published trace is not on this machine")
	return ""
}

func TestReadOpenbTrace(t *testing.T) {
	dir := traceDir(t)
	f, err := os.Open(filepath.Join(dir, "openb_node_list_gpu_node.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nodes, err := ReadNodes(f)
	if err != nil {
		t.Fatal(err)
	}
	gpus := 0
	for _, n := range nodes {
		gpus += n.GPUs
		if err := n.Inventory().Validate(); err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
	}
	// The trace's README: 1213 GPU nodes with 6212 GPUs.
	if len(nodes) != 1213 || gpus != 6212 {
		t.Errorf("%d nodes with %d GPUs, want 1213 with 6212", len(nodes), gpus)
	}
	files, err := filepath.Glob(filepath.Join(dir, "openb_pod_list_*.csv"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no task lists: %v", err)
	}
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		tasks, err := ReadTasks(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(file), err)
		}
		if strings.HasSuffix(file, "_default.csv") && len(tasks) != 8152 {
			t.Errorf("default trace has %d tasks, want 8152", len(tasks))
		}
		for _, task := range tasks {
			pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "task", Resources: v1.ResourceRequirements{Limits: task.Limits()}}}}}
			pod.Annotations = task.Annotations()
			if _, err := gpuinfo.ParsePodRequest(pod, gpuinfo.DefaultResourceNames()); err != nil {
				t.Fatalf("%s: task %s maps to an invalid request: %v", filepath.Base(file), task.Name, err)
			}
		}
	}
}

func TestTaskMapping(t *testing.T) {
	tasks, err := ReadTasks(strings.NewReader(`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
share,6000,12288,1,455,
whole,12000,16384,2,1000,V100M16|V100M32
cpu,4000,8192,0,0,
`))
	if err != nil {
		t.Fatal(err)
	}
	names := gpuinfo.DefaultResourceNames()
	var got []gpuinfo.ContainerRequest
	for _, task := range tasks {
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: task.Name, Resources: v1.ResourceRequirements{Limits: task.Limits()}}}}}
		pod.Annotations = task.Annotations()
		req, err := gpuinfo.ParsePodRequest(pod, names)
		if err != nil {
			t.Fatal(err)
		}
		if req != nil {
			got = append(got, req.Containers...)
			if task.Name == "whole" && !cmp.Equal(req.Selector.Models, []string{"v100m16", "v100m32"}) {
				t.Errorf("selector = %v", req.Selector)
			}
		}
	}
	want := []gpuinfo.ContainerRequest{
		{Name: "share", Count: 1, MemoryPercent: 46, Cores: 46},
		{Name: "whole", Count: 2, Cores: 100},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want,+got):\n%s", diff)
	}
	if tasks[0].GPUMilliTotal() != 455 || tasks[1].GPUMilliTotal() != 2000 || tasks[2].GPUMilliTotal() != 0 {
		t.Errorf("GPU totals %d %d %d", tasks[0].GPUMilliTotal(), tasks[1].GPUMilliTotal(), tasks[2].GPUMilliTotal())
	}
}

func TestTaskDurations(t *testing.T) {
	tasks, err := ReadTasks(strings.NewReader(`name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time
ran,6000,12288,1,500,100,700
instant,6000,12288,1,500,9,9
untimed,6000,12288,1,500,,
`))
	if err != nil {
		t.Fatal(err)
	}
	type duration struct {
		D   time.Duration
		Has bool
	}
	var got []duration
	for _, task := range tasks {
		got = append(got, duration{task.Duration, task.HasDuration})
	}
	want := []duration{{600 * time.Second, true}, {0, true}, {0, false}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("durations (-want,+got):\n%s", diff)
	}
}

func TestReadErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		nodes   bool
		input   string
		wantErr string
	}{
		"missing column":         {false, "name,cpu_milli\nx,1\n", `missing column "memory_mib"`},
		"not a number":           {false, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,2,one,0\n", "row 2: column num_gpu"},
		"shared multi":           {false, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,2,2,500\n", "not a task the trace describes"},
		"deleted before created": {false, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\nx,1,2,1,1000,50,40\n", "deletion_time 40 is before creation_time 50"},
		"bad time":               {false, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\nx,1,2,1,1000,soon,40\n", "column creation_time"},
		"unknown model":          {true, "sn,cpu_milli,memory_mib,gpu,model\nn,1,2,8,H999\n", `unknown GPU model "H999"`},
		"empty":                  {true, "", "empty file"},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			if tc.nodes {
				_, err = ReadNodes(strings.NewReader(tc.input))
			} else {
				_, err = ReadTasks(strings.NewReader(tc.input))
			}
			testutil.CheckError(t, err, tc.wantErr)
		})
	}
}
