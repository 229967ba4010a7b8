package gpushare

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testutil"
)

// TestReserveAcrossPodGroupCycles: kube-scheduler's pod-group cycle runs
// Reserve as a dry run, then Unreserve, then Reserve again for real; a pod
// may also be reserved again after a failed attempt. However often, the
// ledger holds exactly one charge for the pod, on the node of its last
// Reserve, and none after Unreserve; the pod's assignment (what Bind writes)
// names that node's cards, and none after Unreserve on that node.
func TestReserveAcrossPodGroupCycles(t *testing.T) {
	h := newHarness(t, nil,
		testutil.GPUNode("a", testutil.Inventory("a", "A100", 81920, 2)),
		testutil.GPUNode("b", testutil.Inventory("b", "A100", 81920, 2)))
	pod := gpuPod("worker", testutil.Share(20480, 30)).Obj()
	state := framework.NewCycleState()
	if _, s := h.plugin.PreFilter(h.ctx, state, pod, nil); !s.IsSuccess() {
		t.Fatal(s)
	}
	// allocated returns memory held per node.
	allocated := func() map[string]int64 {
		got := map[string]int64{}
		for node, cards := range h.plugin.ledger.Snapshot() {
			for _, c := range cards {
				got[node] += c.Used.MemoryMiB
			}
		}
		return got
	}
	// assignedTo is the node whose cards the pod's assignment names ("" for
	// none), from the cards' UUIDs (GPU-<node>-<index>).
	assignedTo := func() string {
		a := getState(state).assignment
		if a == nil {
			return ""
		}
		nodes := map[string]bool{}
		for _, cards := range a.Containers {
			for _, c := range cards {
				nodes[strings.Split(c.UUID, "-")[1]] = true
			}
		}
		if len(nodes) != 1 {
			t.Fatalf("assignment %v spans nodes %v", a.Containers, nodes)
		}
		for n := range nodes {
			return n
		}
		return ""
	}
	for _, step := range []struct {
		name      string
		do        func()
		wantAlloc map[string]int64
		wantNode  string
	}{
		{"dry-run Reserve", func() { h.plugin.Reserve(h.ctx, state, pod, "a") }, map[string]int64{"a": 20480, "b": 0}, "a"},
		{"Unreserve", func() { h.plugin.Unreserve(h.ctx, state, pod, "a") }, map[string]int64{"a": 0, "b": 0}, ""},
		{"real Reserve", func() { h.plugin.Reserve(h.ctx, state, pod, "a") }, map[string]int64{"a": 20480, "b": 0}, "a"},
		{"Reserve again", func() { h.plugin.Reserve(h.ctx, state, pod, "a") }, map[string]int64{"a": 20480, "b": 0}, "a"},
		{"Reserve on another node", func() { h.plugin.Reserve(h.ctx, state, pod, "b") }, map[string]int64{"a": 0, "b": 20480}, "b"},
		{"Unreserve on the old node", func() { h.plugin.Unreserve(h.ctx, state, pod, "a") }, map[string]int64{"a": 0, "b": 20480}, "b"},
		{"Unreserve", func() { h.plugin.Unreserve(h.ctx, state, pod, "b") }, map[string]int64{"a": 0, "b": 0}, ""},
		{"Unreserve twice", func() { h.plugin.Unreserve(h.ctx, state, pod, "b") }, map[string]int64{"a": 0, "b": 0}, ""},
	} {
		step.do()
		if diff := cmp.Diff(step.wantAlloc, allocated()); diff != "" {
			t.Errorf("after %s, memory held per node (-want,+got):\n%s", step.name, diff)
		}
		if got := assignedTo(); got != step.wantNode {
			t.Errorf("after %s, the assignment names node %q's cards, want %q's", step.name, got, step.wantNode)
		}
	}
}
