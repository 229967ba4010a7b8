package gpushare

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestPostFilterSummary: every node rejected for its GPUs is counted into
// one clause per kind of shortfall, with the largest figure of the kind,
// largest groups first; the Filter reasons themselves carry no figure, so
// kube-scheduler counts them into one line per kind.
func TestPostFilterSummary(t *testing.T) {
	t4a := testutil.GPUNode("t4a", testutil.Inventory("ta", "Tesla T4", 16384, 1))
	t4b := testutil.GPUNode("t4b", testutil.Inventory("tb", "Tesla T4", 16384, 1))
	l4 := testutil.GPUNode("l4", testutil.Inventory("l4", "NVIDIA L4", 23034, 1))
	cpu := st.MakeNode().Name("cpu").Obj()
	broken := st.MakeNode().Name("broken").Annotation(gpuinfo.InventoryAnnotation, `{"version":1,"cards":[{"index":0}]}`).Obj()
	silent := testutil.GPUNode("silent", testutil.Inventory("s", "NVIDIA A100", 81920, 1))
	h := newHarness(t, nil, t4a, t4b, l4, cpu, broken, silent,
		boundPod("t4a-pod", "t4a", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-ta-0", MemoryMiB: 10240, Cores: 50}}}),
		boundPod("t4b-pod", "t4b", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-tb-0", MemoryMiB: 4096, Cores: 50}}}),
		agentLease("silent", time.Now().Add(-10*time.Minute)))
	nodes := []*v1.Node{t4a, t4b, l4, cpu, broken, silent}
	long := strings.Repeat("GPU-0123456789abcdef-0123456789abcdef-0123456789abcdef,", 64) // 3,520 characters
	tests := []struct {
		name        string
		pod         *v1.Pod
		wantReasons map[string]int // Filter's reasons, counted as kube-scheduler counts them
		wantSummary string
	}{
		{
			name: "memory short everywhere",
			pod:  gpuPod("big", testutil.Share(40960, 0)).Obj(),
			wantReasons: map[string]int{
				"no GPU has 40960 MiB free": 3, "node has no GPUs": 1, "GPU inventory invalid": 1, reasonAgentSilent: 1,
			},
			wantSummary: "GPUs: the pod needs 1 GPU with 40960 MiB; 3 nodes with at most 23034 MiB free on a GPU; " +
				"1 node with a GPU agent not reporting (silent for 10m0s); 1 node with an invalid GPU inventory (broken); 1 node without GPUs",
		},
		{
			name: "a UUID selector thousands of characters long is cut",
			pod:  gpuPod("picky", testutil.Cards(2)).Annotation(gpuinfo.UUIDAnnotation, long).Obj(),
			wantReasons: map[string]int{
				"no GPU matches UUID gpu-0123456789abcdef-0123456789abcdef-0123456789abcdef or g...": 3,
				"node has no GPUs": 1, "GPU inventory invalid": 1, reasonAgentSilent: 1,
			},
			wantSummary: "GPUs: the pod needs 2 whole GPUs; 3 nodes with no GPU matching UUID gpu-0123456789abcdef-0123456789abcdef-0123456789abcdef or g...; " +
				"1 node with a GPU agent not reporting (silent for 10m0s); 1 node with an invalid GPU inventory (broken); 1 node without GPUs",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := framework.NewCycleState()
			if _, s := h.plugin.PreFilter(h.ctx, state, tc.pod, nil); !s.IsSuccess() {
				t.Fatal(s)
			}
			statuses := framework.NewDefaultNodeToStatus()
			reasons := map[string]int{}
			for _, n := range nodes {
				s := h.plugin.Filter(h.ctx, state, tc.pod, h.nodeInfo(n))
				if s.IsSuccess() {
					t.Fatalf("node %s fits", n.Name)
				}
				for _, r := range s.Reasons() {
					reasons[r]++
				}
				statuses.Set(n.Name, s.WithPlugin(Name))
			}
			if diff := cmp.Diff(tc.wantReasons, reasons); diff != "" {
				t.Errorf("Filter reasons (-want,+got):\n%s", diff)
			}
			_, s := h.plugin.PostFilter(h.ctx, state, tc.pod, statuses)
			if s.Code() != fwk.Unschedulable {
				t.Errorf("PostFilter code = %v, want Unschedulable (it preempts nothing)", s.Code())
			}
			if diff := cmp.Diff(tc.wantSummary, s.Message()); diff != "" {
				t.Errorf("summary (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		limits map[v1.ResourceName]string
		want   string
	}{
		{testutil.Share(40960, 30), "1 GPU with 40960 MiB and 30% compute"},
		{map[v1.ResourceName]string{"tessera.io/gpu": "2", "tessera.io/gpu-memory-percent": "25"}, "2 GPUs with 25% of the memory each"},
		{testutil.Cards(9), "9 whole GPUs"},
		{map[v1.ResourceName]string{"tessera.io/gpu-cores": "100", "tessera.io/gpu-memory": "1024"}, "1 GPU with 1024 MiB and 100% compute"},
	} {
		req, err := gpuinfo.ParsePodRequest(gpuPod("p", tc.limits).Obj(), gpuinfo.DefaultResourceNames())
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(req); got != tc.want {
			t.Errorf("describe(%v) = %q, want %q", tc.limits, got, tc.want)
		}
	}
}
