package gpushare

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestMIGSlicesThroughThePlugin: a MIG request is filtered, reserved and
// summarised on the slices of a node's cards in MIG mode, never on a plain
// card; a plain request never on a slice.
func TestMIGSlicesThroughThePlugin(t *testing.T) {
	mig := testutil.GPUNode("mig", testutil.MIGInventory("m", []string{"1g.5gb@0", "2g.10gb@2", "3g.20gb@4"}))
	t4 := testutil.GPUNode("t4", testutil.Inventory("t", "Tesla T4", 16384, 1))
	held := boundPod("held", "mig", map[string][]gpuinfo.CardAssignment{"c": {
		{Index: 0, UUID: "GPU-m-0", MemoryMiB: 4000, MIG: &gpuinfo.MIGSlice{Profile: "2g.10gb", Start: 2, UUID: "MIG-m-0-2"}},
	}})
	h := newHarness(t, nil, mig, t4, held)
	migPod := func(name, isolation string, memory int64) *v1.Pod {
		return gpuPod(name, testutil.Share(memory, 0)).Annotation(gpuinfo.IsolationAnnotation, isolation).Obj()
	}
	tests := []struct {
		name        string
		pod         *v1.Pod
		wantReasons map[string][]string // by node; nil: fits
		wantSlice   *gpuinfo.MIGSlice   // reserved on node mig
		wantSummary string
	}{
		{
			name:        "a slice of its own: the smallest free one that holds it",
			pod:         migPod("own", "mig", 6000),
			wantReasons: map[string][]string{"t4": {"no GPU in MIG mode with a healthy slice"}},
			wantSlice:   &gpuinfo.MIGSlice{Profile: "3g.20gb", Start: 4, UUID: "MIG-m-0-4"},
		},
		{
			name:        "a share: beside the other share, the tightest fit",
			pod:         migPod("share", "mig-shared", 5000),
			wantReasons: map[string][]string{"t4": {"no GPU in MIG mode with a healthy slice"}},
			wantSlice:   &gpuinfo.MIGSlice{Profile: "2g.10gb", Start: 2, UUID: "MIG-m-0-2"},
		},
		{
			name:        "no slice large enough",
			pod:         migPod("big", "mig", 25000),
			wantReasons: map[string][]string{"t4": {"no GPU in MIG mode with a healthy slice"}, "mig": {"no free MIG slice has 25000 MiB"}},
			wantSummary: "GPUs: the pod needs 1 MIG slice with 25000 MiB; 1 node with at most 19968 MiB in a free MIG slice; 1 node with no GPU in MIG mode with a healthy slice",
		},
		{
			name:        "a plain share passes the card in MIG mode",
			pod:         gpuPod("plain", testutil.Share(4096, 0)).Obj(),
			wantReasons: map[string][]string{"mig": {"GPUs in MIG mode (ask for a slice with annotation tessera.io/gpu-isolation)"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := framework.NewCycleState()
			if _, s := h.plugin.PreFilter(h.ctx, state, tc.pod, nil); !s.IsSuccess() {
				t.Fatal(s)
			}
			reasons := map[string][]string{}
			statuses := framework.NewDefaultNodeToStatus()
			for _, n := range []*v1.Node{mig, t4} {
				if s := h.plugin.Filter(h.ctx, state, tc.pod, h.nodeInfo(n)); !s.IsSuccess() {
					reasons[n.Name] = s.Reasons()
					statuses.Set(n.Name, s.WithPlugin(Name))
				}
			}
			if diff := cmp.Diff(tc.wantReasons, reasons); diff != "" {
				t.Errorf("Filter reasons (-want,+got):\n%s", diff)
			}
			if tc.wantSummary != "" {
				if _, s := h.plugin.PostFilter(h.ctx, state, tc.pod, statuses); s.Code() != fwk.Unschedulable || s.Message() != tc.wantSummary {
					t.Errorf("PostFilter = %v %q, want Unschedulable %q", s.Code(), s.Message(), tc.wantSummary)
				}
			}
			if tc.wantSlice == nil {
				return
			}
			if s := h.plugin.Reserve(h.ctx, state, tc.pod, "mig"); !s.IsSuccess() {
				t.Fatal(s)
			}
			defer h.plugin.Unreserve(h.ctx, state, tc.pod, "mig")
			a := getState(state).assignment
			if a.Version != gpuinfo.AssignmentVersion2 {
				t.Errorf("assignment version %d, want 2: an older agent must refuse it", a.Version)
			}
			if diff := cmp.Diff(tc.wantSlice, a.Containers[tc.pod.Spec.Containers[0].Name][0].MIG); diff != "" {
				t.Errorf("reserved slice (-want,+got):\n%s", diff)
			}
		})
	}
}
