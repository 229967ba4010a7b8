package gpushare

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// learnHalfCards shows the plugin 200 pods asking half a card and 4 CPUs
// each, through PreFilter: the workload it learns.
func learnHalfCards(h *harness) {
	for i := 0; i < 200; i++ {
		pod := gpuPod(fmt.Sprint("earlier-", i), testutil.Share(40960, 50)).Req(map[v1.ResourceName]string{v1.ResourceCPU: "4"}).Obj()
		h.plugin.PreFilter(h.ctx, framework.NewCycleState(), pod, nil)
	}
}

// scoreNodes runs PreScore, Score on each node and NormalizeScore.
func scoreNodes(t *testing.T, h *harness, pod *v1.Pod, nodes ...fwk.NodeInfo) fwk.NodeScoreList {
	t.Helper()
	return scoreNodesAfter(t, h, pod, true, nodes...)
}

// scoreNodesAfter is scoreNodes, with Filter run on every node first (as
// the framework does) or not, so that Score places the pod itself.
func scoreNodesAfter(t *testing.T, h *harness, pod *v1.Pod, filterFirst bool, nodes ...fwk.NodeInfo) fwk.NodeScoreList {
	t.Helper()
	state := framework.NewCycleState()
	_, pre := h.plugin.PreFilter(h.ctx, state, pod, nil)
	for _, ni := range nodes {
		// The framework skips Filter for a pod PreFilter skipped.
		if filterFirst && pre.Code() != fwk.Skip {
			if s := h.plugin.Filter(h.ctx, state, pod, ni); !s.IsSuccess() {
				t.Fatalf("Filter on node %s: %v", ni.Node().Name, s)
			}
		}
	}
	if s := h.plugin.PreScore(h.ctx, state, pod, nil); !s.IsSuccess() {
		t.Fatalf("PreScore: %v", s)
	}
	var got fwk.NodeScoreList
	for _, ni := range nodes {
		score, s := h.plugin.Score(h.ctx, state, pod, ni)
		if !s.IsSuccess() {
			t.Fatal(s)
		}
		got = append(got, fwk.NodeScore{Name: ni.Node().Name, Score: score})
	}
	if s := h.plugin.NormalizeScore(h.ctx, state, pod, got); !s.IsSuccess() {
		t.Fatal(s)
	}
	return got
}

func TestFragmentationAwareScore(t *testing.T) {
	// "tight" has 60 % of one card free, "roomy" 30 % of one card and a
	// whole empty card. A 20 % share on "tight" leaves no card that can take
	// the half-card requests the cluster sees; on "roomy" it can fill the 30 %
	// fragment. Binpack prefers "tight", the fuller node.
	tight := testutil.GPUNode("tight", testutil.Inventory("t", "A100", 81920, 2))
	roomy := testutil.GPUNode("roomy", testutil.Inventory("r", "A100", 81920, 2))
	objs := append([]runtime.Object{}, tight, roomy,
		boundPod("t0", "tight", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-t-0", MemoryMiB: 32768, Cores: 40}}}),
		boundPod("t1", "tight", map[string][]gpuinfo.CardAssignment{"c": {{Index: 1, UUID: "GPU-t-1", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("r0", "roomy", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-r-0", MemoryMiB: 57344, Cores: 70}}}))
	pod := gpuPod("p", testutil.Share(16384, 20)).Obj()
	for _, tc := range []struct {
		policy config.Policy
		want   fwk.NodeScoreList
	}{
		{config.PolicyFragmentationAware, fwk.NodeScoreList{{Name: "tight", Score: 99}, {Name: "roomy", Score: 100}}},
		{config.PolicyBinpack, fwk.NodeScoreList{{Name: "tight", Score: 100}, {Name: "roomy", Score: 56}}},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			h := newHarness(t, args(tc.policy, tc.policy), objs...)
			learnHalfCards(h)
			if diff := cmp.Diff(tc.want, scoreNodes(t, h, pod, h.nodeInfo(tight), h.nodeInfo(roomy))); diff != "" {
				t.Errorf("scores (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestFragmentationAwareReserve(t *testing.T) {
	// Card 0 has 60 % free, card 1 is empty. Binpack would put a 20 % share
	// on card 0 and leave 40 %, too little for a half card; the
	// fragmentation-aware policy puts it on card 1, which keeps room for
	// half a card, as card 0 does.
	split := testutil.GPUNode("split", testutil.Inventory("s", "A100", 81920, 2))
	objs := append([]runtime.Object{}, split,
		boundPod("s0", "split", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-s-0", MemoryMiB: 32768, Cores: 40}}}))
	pod := gpuPod("p", testutil.Share(16384, 20)).Obj()
	for policy, want := range map[config.Policy]int{config.PolicyFragmentationAware: 1, config.PolicyBinpack: 0} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t, args(policy, policy), objs...)
			learnHalfCards(h)
			state := framework.NewCycleState()
			h.plugin.PreFilter(h.ctx, state, pod, nil)
			if s := h.plugin.Reserve(h.ctx, state, pod, "split"); !s.IsSuccess() {
				t.Fatal(s)
			}
			if got := getState(state).assignment.Containers[pod.Spec.Containers[0].Name][0].Index; got != want {
				t.Errorf("reserved card %d, want %d", got, want)
			}
		})
	}
}

func TestFragmentationAwareScoresPodsWithoutGPUs(t *testing.T) {
	// A 2-CPU pod on "small" leaves 3 CPUs, fewer than the 4 the learned
	// requests need: its free cards would be stranded.
	small := st.MakeNode().Name("small").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "5", v1.ResourcePods: "110"}).
		Annotation(gpuinfo.InventoryAnnotation, testutil.MustEncode(testutil.Inventory("s", "A100", 81920, 2))).Obj()
	large := testutil.GPUNode("large", testutil.Inventory("l", "A100", 81920, 2))
	cpuPod := st.MakePod().Name("cpu").Namespace("default").UID("cpu").Req(map[v1.ResourceName]string{v1.ResourceCPU: "2"}).Obj()
	h := newHarness(t, args(config.PolicyFragmentationAware, config.PolicyBinpack), small, large)
	learnHalfCards(h)
	want := fwk.NodeScoreList{{Name: "small", Score: 99}, {Name: "large", Score: 100}}
	if diff := cmp.Diff(want, scoreNodes(t, h, cpuPod, h.nodeInfo(small), h.nodeInfo(large))); diff != "" {
		t.Errorf("scores (-want,+got):\n%s", diff)
	}
	if w := h.plugin.learner.Workload(); w.Shapes[0].Container.Cores != 50 || w.Shapes[0].CPUMilli != 4000 {
		t.Errorf("heaviest learned shape %+v, want the pending pods' half card with 4 CPUs", w.Shapes[0])
	}
}

func TestRankScores(t *testing.T) {
	scores := fwk.NodeScoreList{{Name: "a", Score: -5000}, {Name: "b", Score: 7}, {Name: "c", Score: 7}, {Name: "d", Score: -5001}}
	rankScores(scores)
	want := fwk.NodeScoreList{{Name: "a", Score: 99}, {Name: "b", Score: 100}, {Name: "c", Score: 100}, {Name: "d", Score: 98}}
	if diff := cmp.Diff(want, scores); diff != "" {
		t.Errorf("ranked scores (-want,+got):\n%s", diff)
	}
}

func TestFragmentationAwareKeepsScarceModels(t *testing.T) {
	// One node of two T4 cards, two of eight G2 cards. The cluster has seen
	// 20 eight-card jobs and 100 one-card jobs that run only on T4 cards.
	// A one-card job that runs anywhere: on the T4 node it strands nothing
	// the eight-card jobs could use (they never fit there), on a G2 node it
	// breaks eight free cards. Counted by frequency and size alone the T4
	// node is the better place, and the T4 jobs lose their cards; counted
	// with the T4 jobs weighed by how scarce T4 cards are (2 of 18), a G2
	// node is.
	t4 := testutil.GPUNode("t4", testutil.Inventory("t", "Tesla T4", 15360, 2))
	g2a := testutil.GPUNode("g2-a", testutil.Inventory("a", "G2", 15360, 8))
	g2b := testutil.GPUNode("g2-b", testutil.Inventory("b", "G2", 15360, 8))
	h := newHarness(t, args(config.PolicyFragmentationAware, config.PolicyFragmentationAware), t4, g2a, g2b)
	for i := 0; i < 120; i++ {
		pod := gpuPod(fmt.Sprint("earlier-", i), map[v1.ResourceName]string{"tessera.io/gpu": "8"})
		if i >= 20 {
			pod = gpuPod(fmt.Sprint("earlier-", i), map[v1.ResourceName]string{"tessera.io/gpu": "1"}).Annotation(gpuinfo.ModelAnnotation, "t4")
		}
		h.plugin.PreFilter(h.ctx, framework.NewCycleState(), pod.Obj(), nil)
	}
	pod := gpuPod("p", map[v1.ResourceName]string{"tessera.io/gpu": "1"}).Obj()
	scores := scoreNodes(t, h, pod, h.nodeInfo(t4), h.nodeInfo(g2a), h.nodeInfo(g2b))
	if scores[0].Score >= scores[1].Score || scores[1].Score != scores[2].Score {
		t.Errorf("scores %v: want both G2 nodes alike and above the T4 node", scores)
	}
}

// TestReserveReplaysTheDryRun follows a pod group's cycle under the
// fragmentation-aware policy: its members are reserved in a dry run, then
// unreserved, then reserved for real — and between the passes the learned
// workload changes, as the learner observes the group's other members. The
// real pass gives each member the cards the dry run gave it: chosen afresh,
// the small member would now go to the empty card (which keeps room for the
// half cards learned meanwhile), and the large member, which fitted there in
// the dry run, would find no card.
func TestReserveReplaysTheDryRun(t *testing.T) {
	split := testutil.GPUNode("split", testutil.Inventory("s", "A100", 81920, 2))
	held := boundPod("s0", "split", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-s-0", MemoryMiB: 32768, Cores: 40}}})
	h := newHarness(t, args(config.PolicyFragmentationAware, config.PolicyFragmentationAware), split, held)
	small := gpuPod("small", testutil.Share(16384, 20)).Obj()
	large := gpuPod("large", testutil.Share(71680, 70)).Obj()
	members := []*v1.Pod{small, large}
	states := []fwk.CycleState{framework.NewCycleState(), framework.NewCycleState()}
	card := func(state fwk.CycleState, pod *v1.Pod) int {
		return getState(state).assignment.Containers[pod.Spec.Containers[0].Name][0].Index
	}
	dry := make([]int, len(members))
	for i, pod := range members {
		h.plugin.PreFilter(h.ctx, states[i], pod, nil)
		if s := h.plugin.Reserve(h.ctx, states[i], pod, "split"); !s.IsSuccess() {
			t.Fatalf("dry run: %s does not fit: %v", pod.Name, s)
		}
		dry[i] = card(states[i], pod)
	}
	if dry[0] == dry[1] {
		t.Fatalf("dry run put both members on card %d; the test needs them apart", dry[0])
	}
	learnHalfCards(h)
	for i := len(members) - 1; i >= 0; i-- {
		h.plugin.Unreserve(h.ctx, states[i], members[i], "split")
	}
	for i, pod := range members {
		if s := h.plugin.Reserve(h.ctx, states[i], pod, "split"); !s.IsSuccess() {
			t.Fatalf("real pass: %s does not fit where the dry run placed it: %v", pod.Name, s)
		}
		if got := card(states[i], pod); got != dry[i] {
			t.Errorf("real pass: %s on card %d, the dry run chose %d", pod.Name, got, dry[i])
		}
	}
}
