package gpushare

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clienttesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// evicted is pod as the scheduler's preemption leaves it: terminating,
// with the DisruptionTarget condition only the scheduler sets.
func evicted(pod *v1.Pod) *v1.Pod {
	pod.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(30 * time.Second)}
	pod.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
		Reason: v1.PodReasonPreemptionByScheduler, LastTransitionTime: metav1.Now()}}
	return pod
}

// TestNominatedPodsClaimOnlyTheirOwnVictims: two preemptors of one priority
// are nominated to one node, each for its own victim. Each is placed on the
// card its own victim frees. When every terminating victim counted for
// every preemptor, the first (a share, under the spread policy) took the
// emptier card the second's victim frees, and the second, needing a whole
// card, had none: its nomination held nothing, and a peer could take its
// card — the randomized preemption test's flake.
func TestNominatedPodsClaimOnlyTheirOwnVictims(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 2))
	card := func(index int, memoryMiB, cores int64) map[string][]gpuinfo.CardAssignment {
		return map[string][]gpuinfo.CardAssignment{"c": {{Index: index, UUID: []string{"GPU-n-0", "GPU-n-1"}[index], MemoryMiB: memoryMiB, Cores: cores}}}
	}
	keeper := boundPod("keeper", "n", card(0, 10240, 50))
	keeper.Spec.Priority = new(int32(2000))
	victimOfShare := evicted(boundPod("victim-of-share", "n", card(0, 10240, 50)))
	victimOfWhole := evicted(boundPod("victim-of-whole", "n", card(1, 81920, 100)))
	share := gpuPod("share", testutil.Share(10240, 50)).Priority(1000).Obj()
	whole := gpuPod("whole", testutil.Cards(1)).Priority(1000).Obj()
	h := newHarness(t, args("Binpack", "Spread"), node, keeper, victimOfShare, victimOfWhole, share, whole)
	h.plugin.victims.record(victimOfShare, []types.UID{share.UID})
	h.plugin.victims.record(victimOfWhole, []types.UID{whole.UID})
	for _, p := range []*v1.Pod{share, whole} { // pending, in this order
		p.Status.NominatedNodeName = "n"
		h.queue.Add(h.ctx, p)
	}

	peer := gpuPod("peer", testutil.Share(1024, 0)).Priority(1000).Obj()
	got := h.plugin.nominatedOn(h.ctx, peer, h.nodeInfo(node))
	want := []allocator.Delta{
		{UUID: "GPU-n-0", Usage: allocator.Usage{MemoryMiB: 10240, Cores: 50}},
		{UUID: "GPU-n-1", Usage: allocator.Usage{MemoryMiB: 81920, Cores: 100}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cards the nominated pods hold (-want,+got):\n%s", diff)
	}
}

// TestNominationKeepsTheCardsItsVictimsFreed: a preemptor whose victim is
// gone keeps the card it freed, and a second preemptor nominated to the node
// is placed on the card its own victim, still terminating, will free. Before,
// the second was placed by the policy on the first's free card, the first
// found no room on its node, and was bound elsewhere: its victim evicted
// for nothing.
func TestNominationKeepsTheCardsItsVictimsFreed(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 2))
	goneVictim := evicted(boundPod("gone-victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}}))
	victim := evicted(boundPod("victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 1, UUID: "GPU-n-1", MemoryMiB: 81920, Cores: 100}}}))
	first := gpuPod("first", testutil.Cards(1)).Priority(1000).Obj()
	second := gpuPod("second", testutil.Share(20480, 20)).Priority(1000).Obj()
	h := newHarness(t, nil, node, victim, first, second)
	h.plugin.victims.record(goneVictim, []types.UID{first.UID})
	h.plugin.victims.drop(goneVictim.UID)
	h.plugin.victims.record(victim, []types.UID{second.UID})
	for _, p := range []*v1.Pod{first, second} {
		p.Status.NominatedNodeName = "n"
		h.queue.Add(h.ctx, p)
	}

	checkFirstKeepsItsCard(t, h, node, first, second, []allocator.Delta{{UUID: "GPU-n-1", Usage: allocator.Usage{MemoryMiB: 20480, Cores: 20}}})
	// Bound, it claims nothing any more.
	bound := first.DeepCopy()
	bound.Spec.NodeName = "n"
	h.plugin.onPod(bound)
	if got := h.plugin.victims.claimed(first.UID, "n"); got != nil {
		t.Errorf("a bound preemptor still claims %v", got)
	}
}

// TestNominatedPodsKeepOffEachOthersCards: two preemptors of one priority
// are nominated to one node, their victims gone. The second needs two
// cards, one more than its victim freed. Placed by the policy where it
// fits now, it took the card the first one's victim freed, and the first,
// finding no room on its node, bound elsewhere: its victim evicted for
// nothing (the randomized preemption test's flake, seed 3). A nominated pod
// is never placed on the cards another pod nominated to the node claims.
func TestNominatedPodsKeepOffEachOthersCards(t *testing.T) {
	full := allocator.Usage{MemoryMiB: 81920, Cores: 100}
	for _, tc := range []struct {
		name string
		// keeper, when set, holds part of card 2.
		keeper bool
		// want is what the second preemptor holds in the first's cycle.
		want []allocator.Delta
	}{
		{name: "a free card beside its own", want: []allocator.Delta{{UUID: "GPU-n-1", Usage: full}, {UUID: "GPU-n-2", Usage: full}}},
		{name: "no card but the first's beside its own", keeper: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 3))
			holding := func(name string, index int, usage allocator.Usage) *v1.Pod {
				return boundPod(name, "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: index, UUID: []string{"GPU-n-0", "GPU-n-1", "GPU-n-2"}[index], MemoryMiB: usage.MemoryMiB, Cores: usage.Cores}}})
			}
			firstVictim, secondVictim := evicted(holding("first-victim", 0, full)), evicted(holding("second-victim", 1, full))
			first := gpuPod("first", testutil.Cards(1)).Priority(1000).Obj()
			second := gpuPod("second", testutil.Cards(2)).Priority(1000).Obj()
			objs := []runtime.Object{node, first, second}
			if tc.keeper {
				keeper := holding("keeper", 2, allocator.Usage{MemoryMiB: 10240, Cores: 10})
				keeper.Spec.Priority = new(int32(2000))
				objs = append(objs, keeper)
			}
			h := newHarness(t, nil, objs...)
			for victim, preemptor := range map[*v1.Pod]*v1.Pod{firstVictim: first, secondVictim: second} {
				h.plugin.victims.record(victim, []types.UID{preemptor.UID})
				h.plugin.victims.drop(victim.UID)
			}
			for _, p := range []*v1.Pod{second, first} {
				p.Status.NominatedNodeName = "n"
				h.queue.Add(h.ctx, p)
			}

			checkFirstKeepsItsCard(t, h, node, first, second, tc.want)
		})
	}
}

// checkFirstKeepsItsCard checks, in the first preemptor's cycle on node,
// what the second, nominated there too, holds (want), and that the first
// fits beside it.
func checkFirstKeepsItsCard(t *testing.T, h *harness, node *v1.Node, first, second *v1.Pod, want []allocator.Delta) {
	t.Helper()
	ni := h.nodeInfo(node)
	if diff := cmp.Diff(want, h.plugin.nominatedOn(h.ctx, first, ni)); diff != "" {
		t.Errorf("cards the second preemptor holds (-want,+got):\n%s", diff)
	}
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, first, nil)
	secondInfo, _ := framework.NewPodInfo(second)
	if s := h.plugin.AddPod(h.ctx, state, first, secondInfo, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, state, first, ni); !s.IsSuccess() {
		t.Errorf("the first preemptor does not fit the card its victim freed: %v", s)
	}
}

// TestPreemptorWaitsBeforeItsNominationShows: a preemptor retried before
// the status update carrying its nomination reached the scheduling queue
// (its pod object names no node yet) is still held to the node its victim
// is terminating on. Before, that cycle saw no nomination, looked at every
// node, and preempted again on another one: its first victim evicted for
// nothing (the randomized preemption test's flake, seed 3).
func TestPreemptorWaitsBeforeItsNominationShows(t *testing.T) {
	nodes := []*v1.Node{testutil.GPUNode("a", testutil.Inventory("a", "A100", 81920, 1)), testutil.GPUNode("b", testutil.Inventory("b", "A100", 81920, 1))}
	victim := evicted(boundPod("victim", "b", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-b-0", MemoryMiB: 20480, Cores: 20}}}))
	preemptor := gpuPod("preemptor", testutil.Share(20480, 20)).Priority(1000).Obj()
	h := newHarness(t, nil, nodes[0], nodes[1], victim, preemptor)
	h.plugin.victims.record(victim, []types.UID{preemptor.UID})

	res, status := h.plugin.PreFilter(h.ctx, framework.NewCycleState(), preemptor, nil)
	if !status.IsSuccess() {
		t.Fatal(status)
	}
	if res == nil || !res.NodeNames.Equal(sets.New("b")) {
		t.Errorf("PreFilter result %v, want the preemptor held to node b while its victim terminates", res)
	}
}

// TestPreemptorPrefersItsVictimsNode: once its victim is gone, a preemptor
// whose pod object does not show its nomination yet is tried on its
// victim's node first, as kube-scheduler tries a nominated node: where it
// fits there, only there. Before, the cycle chose among all nodes by score
// and could bind elsewhere, its victim evicted for nothing.
func TestPreemptorPrefersItsVictimsNode(t *testing.T) {
	nodes := []*v1.Node{testutil.GPUNode("a", testutil.Inventory("a", "A100", 81920, 1)), testutil.GPUNode("b", testutil.Inventory("b", "A100", 81920, 1))}
	gone := evicted(boundPod("victim", "b", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-b-0", MemoryMiB: 20480, Cores: 20}}}))
	preemptor := gpuPod("preemptor", testutil.Share(20480, 20)).Priority(1000).Obj()
	h := newHarness(t, nil, nodes[0], nodes[1], preemptor)
	h.plugin.victims.record(gone, []types.UID{preemptor.UID})
	h.plugin.victims.drop(gone.UID)

	res, status := h.plugin.PreFilter(h.ctx, framework.NewCycleState(), preemptor, nil)
	if !status.IsSuccess() {
		t.Fatal(status)
	}
	if res == nil || !res.NodeNames.Equal(sets.New("b")) {
		t.Errorf("PreFilter result %v, want node b, where the preemptor's victim was", res)
	}
}

func TestEvictedFor(t *testing.T) {
	preemptor := gpuPod("preemptor", testutil.Cards(1)).Priority(1000).Obj()
	other := gpuPod("other", testutil.Cards(1)).Priority(1000).Obj()
	pod := func(name string, priority int32, terminating bool) *v1.Pod {
		p := gpuPod(name, testutil.Cards(1)).Priority(priority).Obj()
		if terminating {
			return evicted(p)
		}
		return p
	}
	tests := []struct {
		name   string
		victim *v1.Pod
		book   func(b *victimBook, v *v1.Pod)
		want   bool
	}{
		{name: "recorded for the preemptor", victim: pod("v", 0, true),
			book: func(b *victimBook, v *v1.Pod) { b.record(v, []types.UID{preemptor.UID, other.UID}) }, want: true},
		{name: "recorded for another preemptor", victim: pod("v", 0, true),
			book: func(b *victimBook, v *v1.Pod) { b.record(v, []types.UID{other.UID}) }, want: false},
		{name: "recorded, then forgotten: the priority rule", victim: pod("v", 0, true),
			book: func(b *victimBook, v *v1.Pod) {
				b.record(v, []types.UID{other.UID})
				b.forget("v", []types.UID{other.UID})
			}, want: true},
		{name: "recorded, then dropped: the priority rule", victim: pod("v", 0, true),
			book: func(b *victimBook, v *v1.Pod) {
				b.record(v, []types.UID{other.UID})
				b.drop("v")
			}, want: true},
		{name: "forgotten by one of two preemptors", victim: pod("v", 0, true),
			book: func(b *victimBook, v *v1.Pod) {
				b.record(v, []types.UID{other.UID, preemptor.UID})
				b.forget("v", []types.UID{other.UID})
			}, want: true},
		{name: "unknown, of lower priority (evicted before a restart)", victim: pod("v", 999, true), want: true},
		{name: "unknown, of equal priority", victim: pod("v", 1000, true), want: false},
		{name: "recorded but not terminating by preemption", victim: pod("v", 0, false),
			book: func(b *victimBook, v *v1.Pod) { b.record(v, []types.UID{preemptor.UID}) }, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newVictimBook()
			if tc.book != nil {
				tc.book(b, tc.victim)
			}
			if got := b.evictedFor(tc.victim, preemptor); got != tc.want {
				t.Errorf("evictedFor = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestPreemptionRecordsItsVictims: the preemption plugin's eviction records
// the victim for its preemptor, and takes the record back when the
// eviction fails.
func TestPreemptionRecordsItsVictims(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	victim := boundPod("victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}})
	failing := boundPod("failing", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}})
	preemptor := gpuPod("preemptor", testutil.Cards(1)).Priority(1000).Obj()
	h := newHarness(t, nil, node, victim, failing, preemptor)
	// As the API server with a grace period: the victim stays, terminating.
	h.client.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, nil })
	h.client.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.PatchAction).GetName() == failing.Name {
			return true, nil, errors.New("the API server is unavailable")
		}
		return false, nil, nil
	})
	pl, err := NewPreemption(h.ctx, nil, h.plugin.handle)
	if err != nil {
		t.Fatal(err)
	}
	evict := pl.(*Preemption).Executor.PreemptPod
	c := candidateOn("n")
	if _, err := evict(h.ctx, c, podPreemptor{preemptor}, victim, PreemptionName); err != nil {
		t.Fatal(err)
	}
	if _, err := evict(h.ctx, c, podPreemptor{preemptor}, failing, PreemptionName); err == nil {
		t.Fatal("the failing eviction succeeded")
	}
	book := h.plugin.victims
	book.mu.Lock()
	got := map[types.UID][]types.UID{}
	for v, set := range book.preemptors {
		got[v] = set.UnsortedList()
	}
	book.mu.Unlock()
	if diff := cmp.Diff(map[types.UID][]types.UID{victim.UID: {preemptor.UID}}, got); diff != "" {
		t.Errorf("victims recorded (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(sets.New("GPU-n-0"), book.claimed(preemptor.UID, "n")); diff != "" {
		t.Errorf("cards claimed (-want,+got):\n%s", diff)
	}
}

// candidateOn is a preemption candidate on node; the eviction reads only
// its name.
type candidateOn string

func (c candidateOn) Victims() *extenderv1.Victims { return &extenderv1.Victims{} }
func (c candidateOn) Name() string                 { return string(c) }
func (c candidateOn) NumPodGroupDisruptions() int  { return 0 }

// podPreemptor is one pod preempting, as the executor sees it.
type podPreemptor struct{ *v1.Pod }

func (p podPreemptor) UID() types.UID           { return p.Pod.UID }
func (p podPreemptor) SchedulerName() string    { return p.Spec.SchedulerName }
func (p podPreemptor) Obj() runtime.Object      { return p.Pod }
func (p podPreemptor) Pods() map[string]*v1.Pod { return map[string]*v1.Pod{p.Name: p.Pod} }
func (p podPreemptor) Priority() int32          { return *p.Spec.Priority }
func (p podPreemptor) Type() string             { return "pod" }

func TestPreemptionArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    runtime.Object
		want    *schedconfig.DefaultPreemptionArgs
		wantErr string
	}{
		{name: "none: kube-scheduler's defaults", want: &schedconfig.DefaultPreemptionArgs{MinCandidateNodesPercentage: 10, MinCandidateNodesAbsolute: 100}},
		{name: "a profile's, undecoded", args: &runtime.Unknown{Raw: []byte(`{"minCandidateNodesPercentage": 20}`)},
			want: &schedconfig.DefaultPreemptionArgs{MinCandidateNodesPercentage: 20, MinCandidateNodesAbsolute: 100}},
		{name: "an unknown field", args: &runtime.Unknown{Raw: []byte(`{"minCandidateNodes": 20}`)},
			wantErr: `unknown field "minCandidateNodes"`},
		{name: "another plugin's args", args: &schedconfig.NodeResourcesFitArgs{},
			wantErr: "want args of type DefaultPreemptionArgs, got *config.NodeResourcesFitArgs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := preemptionArgs(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("args (-want,+got):\n%s", diff)
			}
		})
	}
}
