package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestMultiCardContainerGetsDistinctCards(t *testing.T) {
	e := newEnv(t)
	node := e.node("a", cluster.H100, 8, nil)
	e.startScheduler()
	e.create(e.podSpec("four", "tessera-binpack", map[string]int64{"tessera.io/gpu": 4}))
	p := placementOf(t, e.waitBound(30*time.Second, "four")["four"])
	if p.Node != node {
		t.Errorf("bound to %s, want %s", p.Node, node)
	}
	seen := map[int]bool{}
	for _, c := range p.Cards {
		seen[c] = true
	}
	if len(p.Cards) != 4 || len(seen) != 4 {
		t.Errorf("cards %v, want 4 distinct", p.Cards)
	}
}

func TestUnfitPodStaysPendingWithReason(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.T4, 2, nil)
	e.startScheduler()
	e.create(e.podSpec("huge", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 40000}))
	msg := e.waitUnschedulable("huge")
	// kube-scheduler's count of the Filter reason, then GPUShare's summary.
	for _, want := range []string{"1 no GPU has 40000 MiB free", "GPUs: the pod needs 1 GPU with 40000 MiB; 1 node with at most 15360 MiB free on a GPU"} {
		if !strings.Contains(msg, want) {
			t.Errorf("PodScheduled message %q does not say %q", msg, want)
		}
	}
	e.waitFor(30*time.Second, "a FailedScheduling event", func() (bool, error) {
		events, err := e.client.EventsV1().Events(e.ns).List(e.tCtx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("regarding.name", "huge").String(),
		})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if ev.Reason == "FailedScheduling" && strings.Contains(ev.Note, "no GPU has 40000 MiB free") {
				return true, nil
			}
		}
		return false, nil
	})
}

func TestInvalidRequestGetsClearMessage(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.T4, 2, nil)
	e.startScheduler()
	e.create(e.podSpec("bad", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024, "tessera.io/gpu-memory-percent": 10}))
	e.create(e.podSpec("good", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024}))
	msg := e.waitUnschedulable("bad")
	want := `invalid GPU request: container "main": resource tessera.io/gpu-memory-percent: cannot be combined with tessera.io/gpu-memory`
	if !strings.Contains(msg, want) {
		t.Errorf("message %q does not contain %q", msg, want)
	}
	e.waitBound(30*time.Second, "good")
}

func TestSelectors(t *testing.T) {
	e := newEnv(t)
	a100 := e.node("a100", cluster.A100, 2, nil)
	t4 := e.node("t4", cluster.T4, 2, nil)
	e.startScheduler()
	tests := []struct {
		name        string
		annotations map[string]string
		wantNode    string
		wantCards   []int
	}{
		{"model", map[string]string{gpuinfo.ModelAnnotation: "t4"}, t4, nil},
		{"model-exclude", map[string]string{gpuinfo.ModelExcludeAnnotation: "Tesla"}, a100, nil},
		{"uuid", map[string]string{gpuinfo.UUIDAnnotation: "GPU-sim-" + a100 + "-1"}, a100, []int{1}},
		{"uuid-exclude", map[string]string{gpuinfo.ModelAnnotation: "A100", gpuinfo.UUIDExcludeAnnotation: "GPU-sim-" + a100 + "-0"}, a100, []int{1}},
	}
	for _, tc := range tests {
		pod := e.podSpec(tc.name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024})
		pod.Annotations = tc.annotations
		e.create(pod)
	}
	for _, tc := range tests {
		got := placementOf(t, e.waitBound(30*time.Second, tc.name)[tc.name])
		if got.Node != tc.wantNode {
			t.Errorf("%s: node %s, want %s", tc.name, got.Node, tc.wantNode)
		}
		if tc.wantCards != nil && !cmp.Equal(got.Cards, tc.wantCards) {
			t.Errorf("%s: cards %v, want %v", tc.name, got.Cards, tc.wantCards)
		}
	}
	pod := e.podSpec("nowhere", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
	pod.Annotations = map[string]string{gpuinfo.ModelAnnotation: "B200"}
	e.create(pod)
	if msg := e.waitUnschedulable("nowhere"); !strings.Contains(msg, "no GPU matches model b200") {
		t.Errorf("message %q does not name the model", msg)
	}
}

func TestRequeueWhenCapacityAppears(t *testing.T) {
	e := newEnv(t)
	node := e.node("a", cluster.A100, 1, nil)
	e.startScheduler()
	e.create(e.podSpec("holder", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	e.waitBound(30*time.Second, "holder")
	e.create(e.podSpec("waiter", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	e.waitUnschedulable("waiter")
	e.deletePod("holder")
	start := time.Now()
	e.waitBound(5*time.Second, "waiter")
	t.Logf("bound %v after the blocking pod was deleted", time.Since(start).Round(time.Millisecond))

	// An inventory that grows makes room too.
	e.create(e.podSpec("second", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	e.waitUnschedulable("second")
	grown, err := cluster.SimulatedInventory(node, cluster.A100, 2)
	if err != nil {
		t.Fatal(err)
	}
	e.publishInventory(node, mustEncode(t, grown))
	start = time.Now()
	e.waitBound(5*time.Second, "second")
	t.Logf("bound %v after the inventory grew", time.Since(start).Round(time.Millisecond))
	e.checkNoOvercommit(t)
}

func mustEncode(t *testing.T, inv *gpuinfo.Inventory) string {
	t.Helper()
	raw, err := inv.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestRestartRebuildsLedger(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.L4, 2, nil)
	e.node("b", cluster.L4, 2, nil)
	first := e.startScheduler()
	var names []string
	for i := 0; i < 6; i++ {
		name := fmt.Sprint("before-", i)
		names = append(names, name)
		e.create(e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 6000, "tessera.io/gpu-cores": 25}))
	}
	e.waitBound(30*time.Second, names...)
	first.Stop()
	e.startScheduler()
	// 4 cards of 23034 MiB hold 3 such pods each (by memory), 12 in all;
	// 6 are placed, so 6 more fit. A scheduler that forgot the first 6
	// would place all 12.
	var more []string
	for i := 0; i < 12; i++ {
		name := fmt.Sprint("after-", i)
		more = append(more, name)
		e.create(e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 6000, "tessera.io/gpu-cores": 25}))
	}
	e.waitFor(30*time.Second, "6 of 12 more pods to be bound and 6 unschedulable", func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		bound, unschedulable := 0, 0
		for _, p := range pods.Items {
			if !strings.HasPrefix(p.Name, "after-") {
				continue
			}
			if p.Spec.NodeName != "" {
				bound++
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
					unschedulable++
				}
			}
		}
		return bound == 6 && unschedulable == 6, nil
	})
	if got := e.checkNoOvercommit(t); got != 12 {
		t.Errorf("%d GPU pods bound, want 12", got)
	}
}

// TestFinishedPodsFreeTheirCards: a pod that reaches Succeeded or Failed
// (kubelet reports it; its object stays) gives its card back, and the pod
// waiting for it is bound at once.
func TestFinishedPodsFreeTheirCards(t *testing.T) {
	for _, phase := range []v1.PodPhase{v1.PodSucceeded, v1.PodFailed} {
		t.Run(string(phase), func(t *testing.T) {
			e := newEnv(t)
			e.node("a", cluster.A100, 1, nil)
			e.startScheduler()
			e.create(e.podSpec("job", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
			job := e.waitBound(30*time.Second, "job")["job"]
			e.create(e.podSpec("next", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024}))
			e.waitUnschedulable("next")

			job.Status.Phase = phase
			if _, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(e.tCtx, job, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			e.waitBound(10*time.Second, "next")
			t.Logf("bound %v after the job %s", time.Since(start).Round(time.Millisecond), phase)
			e.checkNoOvercommit(t)
		})
	}
}

// TestCardCountAgreesWithKubelet: kubelet admits pods that ask for the card
// count (tessera.io/gpu) against what the agent's device plugin advertises,
// cards × split; the scheduler holds to the same count instead of placing a
// pod kubelet would then reject.
func TestCardCountAgreesWithKubelet(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.A100, 1, nil) // advertises 1 × 10 units
	e.startScheduler()
	var names []string
	for i := 0; i < gpuinfo.DefaultSplitCount; i++ {
		names = append(names, fmt.Sprint("share-", i))
		e.create(e.podSpec(names[i], "tessera-binpack", map[string]int64{"tessera.io/gpu": 1, "tessera.io/gpu-memory": 1024}))
	}
	e.waitBound(30*time.Second, names...)
	e.create(e.podSpec("one-too-many", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1, "tessera.io/gpu-memory": 1024}))
	if msg := e.waitUnschedulable("one-too-many"); !strings.Contains(msg, "Insufficient tessera.io/gpu") {
		t.Errorf("message %q does not name the exhausted card count", msg)
	}
}
