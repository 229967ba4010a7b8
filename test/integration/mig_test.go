package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// migCard is an A100 40GB in MIG mode with a 3g.20gb slice at slot 0, a
// 2g.10gb at 4 and a 1g.5gb at 6, as its agent publishes it (inventory
// version 2).
const migCard cluster.CardSpec = "A100-40GB:mig=3g.20gb+2g.10gb+1g.5gb"

// TestMIGStaticSlices: on a fleet of a node whose card is in MIG mode
// (inventory version 2) and a node of whole cards (version 1), the real
// scheduler gives a pod asking for a slice of its own the smallest free slice
// that holds it, puts two memory shares inside one slice, keeps plain shares
// off the card in MIG mode and MIG pods off the whole cards, and says why a
// slice too large for any is pending; no slice is over-committed.
func TestMIGStaticSlices(t *testing.T) {
	e := newEnv(t)
	migNode := e.node("mig", migCard, 1, nil)
	plain := e.node("plain", cluster.A100, 1, nil)
	e.startScheduler()
	e.create(e.migPod("own", "mig", 8000))
	e.create(e.migPod("share-a", "mig-shared", 2000))
	e.create(e.migPod("share-b", "mig-shared", 2000))
	e.create(e.podSpec("whole-card-share", "tessera-binpack", share4GiB30))
	bound := e.waitBound(30*time.Second, "own", "share-a", "share-b", "whole-card-share")
	type got struct {
		Node  string
		Slice string
	}
	where := func(name string) got {
		pod := bound[name]
		e := assignment(t, pod).Containers["main"][0]
		if e.MIG == nil {
			return got{pod.Spec.NodeName, ""}
		}
		return got{pod.Spec.NodeName, e.MIG.Profile + "@" + string(rune('0'+e.MIG.Start))}
	}
	want := map[string]got{
		"own":              {migNode, "2g.10gb@4"},
		"share-a":          {migNode, "1g.5gb@6"},
		"share-b":          {migNode, "1g.5gb@6"},
		"whole-card-share": {plain, ""},
	}
	for name, w := range want {
		if diff := cmp.Diff(w, where(name)); diff != "" {
			t.Errorf("pod %s (-want,+got):\n%s", name, diff)
		}
	}
	if a := assignment(t, bound["own"]); a.Version != gpuinfo.AssignmentVersion2 {
		t.Errorf("a MIG assignment has version %d, want 2", a.Version)
	}
	e.create(e.migPod("too-big", "mig", 30000))
	if msg := e.waitUnschedulable("too-big"); !strings.Contains(msg, "GPUs: the pod needs 1 MIG slice with 30000 MiB") ||
		!strings.Contains(msg, "1 node with at most 19968 MiB in a free MIG slice") {
		t.Errorf("pending message %q does not say that no free slice holds 30000 MiB", msg)
	}
	e.checkNoOvercommit(t)
}

// migPod is a binpack pod asking for memoryMiB with the isolation given
// (tessera.io/gpu-isolation: mig or mig-shared).
func (e *env) migPod(name, isolation string, memoryMiB int64) *v1.Pod {
	pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": memoryMiB})
	pod.Annotations = map[string]string{gpuinfo.IsolationAnnotation: isolation}
	return pod
}

// prioritizedAs gives pod the priority class.
func prioritizedAs(pod *v1.Pod, class string) *v1.Pod {
	pod.Spec.PriorityClassName = class
	return pod
}

// migInstances reads the node's published slices, "CARD:PROFILE@START" each.
func (e *env) migInstances(node string) ([]string, error) {
	n, err := e.client.CoreV1().Nodes().Get(e.tCtx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	inv, err := gpuinfo.DecodeInventory(n.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil {
		return nil, err
	}
	var got []string
	for _, c := range inv.Cards {
		if c.MIG == nil {
			continue
		}
		for _, in := range c.MIG.Instances {
			got = append(got, fmt.Sprintf("%d:%s@%d", c.Index, in.Profile, in.Start))
		}
	}
	sort.Strings(got)
	return got, nil
}

// waitSlices waits until the node publishes exactly the slices want.
func (e *env) waitSlices(node string, want ...string) {
	e.tCtx.Helper()
	sort.Strings(want)
	var got []string
	e.waitFor(30*time.Second, fmt.Sprintf("node %s to publish slices %v", node, want), func() (bool, error) {
		var err error
		got, err = e.migInstances(node)
		return cmp.Equal(want, got, cmpopts.EquateEmpty()), err
	})
}

// TestMIGDynamicSlices: on a dynamic card the real scheduler chooses each
// slice's profile and placement, keeping the largest profiles possible (a
// 1g.5gb at slot 6, so that a 4g.20gb still fits at 0), and the node's
// agent, watching its pods as its own identity, creates each slice when its
// pod appears and destroys it when the pod is gone; the inventory follows.
func TestMIGDynamicSlices(t *testing.T) {
	e := newEnv(t)
	dyn := e.node("dyn", "A100-40GB:mig-dynamic=", 1, nil)
	e.startScheduler()
	e.create(e.migPod("small", "mig", 4000))
	small := assignment(t, e.waitBound(30*time.Second, "small")["small"]).Containers["main"][0]
	if small.MIG == nil || small.MIG.Profile != "1g.5gb" || small.MIG.Start != 6 || small.MIG.UUID != "" {
		t.Fatalf("small got %+v, want a 1g.5gb slice to create at slot 6", small.MIG)
	}
	e.waitSlices(dyn, "0:1g.5gb@6")
	named := e.migPod("large", "mig", 16000)
	named.Annotations[gpuinfo.MIGProfileAnnotation] = "4g.20gb"
	e.create(named)
	large := assignment(t, e.waitBound(30*time.Second, "large")["large"]).Containers["main"][0]
	if large.MIG == nil || large.MIG.Profile != "4g.20gb" || large.MIG.Start != 0 {
		t.Fatalf("large got %+v, want 4g.20gb at slot 0 (first-fit would have blocked it)", large.MIG)
	}
	e.waitSlices(dyn, "0:1g.5gb@6", "0:4g.20gb@0")
	e.checkNoOvercommit(t)
	e.deletePod("small")
	e.waitSlices(dyn, "0:4g.20gb@0")
}

// TestAgentMayFailOnlyItsOwnPods: the agent's identity may mark Failed, with
// the MIG slice reason, a running pod bound to its own node, and nothing
// else: not a pod of another node, not with another reason, not changing the
// pod's annotations through its status.
func TestAgentMayFailOnlyItsOwnPods(t *testing.T) {
	e := newEnv(t)
	mine, theirs := e.plainNode("mine"), e.plainNode("theirs")
	bound := func(name, node string) *v1.Pod {
		pod := e.podSpec(name, "default-scheduler", nil)
		pod.Spec.NodeName = node
		return e.create(pod)
	}
	own, other, annotated, reasoned := bound("own", mine), bound("other", theirs), bound("annotated", mine), bound("reasoned", mine)
	agent := e.agentClient(mine)
	publisher := &publish.Publisher{Client: agent, NodeName: mine, Namespace: manifests.Namespace}
	statusPatch := func(pod *v1.Pod, patch string) error {
		_, err := agent.CoreV1().Pods(pod.Namespace).Patch(e.tCtx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
		return err
	}
	// The policy is loaded asynchronously: wait until it refuses the
	// other node's pod.
	e.waitFor(30*time.Second, "the policy tessera-agent-pod-status to refuse another node's pod", func() (bool, error) {
		err := publisher.FailPod(e.tCtx, other, "probe")
		return install.DeniedBy(err, install.PolicyAgentPodStatus), nil
	})
	// A pod of the other node that was never touched before.
	fresh := bound("other-fresh", theirs)
	for _, tc := range []struct {
		name string
		try  func() error
	}{
		{"a pod of another node", func() error { return publisher.FailPod(e.tCtx, fresh, "probe") }},
		{"another reason", func() error {
			return statusPatch(reasoned, `{"status":{"phase":"Failed","reason":"Evicted"}}`)
		}},
		{"an annotation changed through the status", func() error {
			return statusPatch(annotated, `{"metadata":{"annotations":{"tessera.io/gpu-model":"H100"}},"status":{"phase":"Failed","reason":"GPUMIGSliceUnavailable"}}`)
		}},
	} {
		if err := tc.try(); !install.DeniedBy(err, install.PolicyAgentPodStatus) {
			t.Errorf("%s: %v, want a refusal by %s", tc.name, err, install.PolicyAgentPodStatus)
		}
	}
	if err := publisher.FailPod(e.tCtx, own, "creating its MIG slice failed"); err != nil {
		t.Fatalf("failing its own node's pod: %v", err)
	}
	got, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, own.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1.PodFailed || got.Status.Reason != publish.ReasonMIGSliceUnavailable || !strings.Contains(got.Status.Message, "creating its MIG slice failed") {
		t.Errorf("pod status %+v, want Failed with the MIG slice reason", got.Status)
	}
	// Once finished, it stays finished.
	if err := publisher.FailPod(e.tCtx, got, "again"); !install.DeniedBy(err, install.PolicyAgentPodStatus) {
		t.Errorf("failing a finished pod again: %v, want a refusal", err)
	}
}

// TestMIGPreemptionFreesTheRightSlice: a high-priority pod asking for a
// slice of its own on a node whose slices are all held evicts the holders
// of one slice that holds it — the two shares of the 2g.10gb slice, not the
// pod of the smaller 1g.5gb slice — and gets that slice.
func TestMIGPreemptionFreesTheRightSlice(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("mig", "A100-40GB:mig=2g.10gb@0+1g.5gb@6", 1, nil)
	e.startScheduler()
	k := e.startKubelet()
	// small first, bound before the shares come: a share placed first
	// would take the 1g.5gb slice (the best fit), leaving small the 2g.10gb
	// one and the second share no room.
	e.create(prioritizedAs(e.migPod("small", "mig", 4000), lowPriority))
	e.waitBound(30*time.Second, "small")
	e.create(prioritizedAs(e.migPod("share-a", "mig-shared", 4000), lowPriority))
	e.create(prioritizedAs(e.migPod("share-b", "mig-shared", 4000), lowPriority))
	e.waitBound(30*time.Second, "share-a", "share-b")
	e.create(prioritizedAs(e.migPod("urgent", "mig", 8000), highPriority))
	urgent := assignment(t, e.waitBound(60*time.Second, "urgent")["urgent"]).Containers["main"][0]
	if urgent.MIG == nil || urgent.MIG.Profile != "2g.10gb" || urgent.MIG.Start != 0 {
		t.Errorf("urgent got %+v, want the 2g.10gb slice", urgent.MIG)
	}
	evicted := k.evicted()
	sort.Strings(evicted)
	if diff := cmp.Diff([]string{"share-a", "share-b"}, evicted); diff != "" {
		t.Errorf("evicted (-want,+got):\n%s", diff)
	}
	e.checkNoOvercommit(t)
}

// TestMIGSliceFailureFailsThePod: when the agent cannot make the slice the
// scheduler chose on a dynamic card, it marks the pod Failed with the
// reason (as the agent's own identity, through the policy
// tessera-agent-pod-status), and the scheduler frees its place: the next pod
// gets that placement.
func TestMIGSliceFailureFailsThePod(t *testing.T) {
	e := newEnv(t)
	node, a := e.quietNode("dyn", "A100-40GB:mig-dynamic=", 1, nil)
	backend := a.Backend.(*discovery.Simulated)
	backend.SetMIGFailure("the driver is out of memory for instances")
	ctx, cancel := context.WithCancel(e.tCtx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	e.tCtx.Cleanup(func() { cancel(); <-done })
	e.startScheduler()
	e.create(e.migPod("doomed", "mig", 30000))
	e.waitBound(30*time.Second, "doomed")
	var failed *v1.Pod
	e.waitFor(30*time.Second, "pod doomed to be marked Failed", func() (bool, error) {
		var err error
		failed, err = e.client.CoreV1().Pods(e.ns).Get(e.tCtx, "doomed", metav1.GetOptions{})
		return err == nil && failed.Status.Phase == v1.PodFailed, err
	})
	if failed.Status.Reason != publish.ReasonMIGSliceUnavailable || !strings.Contains(failed.Status.Message, "the driver is out of memory for instances") {
		t.Errorf("failed pod's status %+v, want reason %s with the driver's error", failed.Status, publish.ReasonMIGSliceUnavailable)
	}
	// Its place is free again: the next pod gets the card's 7g.40gb slice.
	backend.SetMIGFailure("")
	e.create(e.migPod("next", "mig", 30000))
	next := assignment(t, e.waitBound(30*time.Second, "next")["next"]).Containers["main"][0]
	if next.MIG == nil || next.MIG.Profile != "7g.40gb" {
		t.Errorf("next got %+v, want the 7g.40gb slice the failed pod held", next.MIG)
	}
	e.waitSlices(node, "0:7g.40gb@0")
}

// TestMIGWithAnAgentOfVersion1: an agent kept at inventory version 1
// (--inventory-version=1, as during an upgrade) publishes its card in MIG
// mode without slices: the new scheduler reads the node, places shares on
// its whole card, and keeps MIG pods off the card in MIG mode, saying why.
func TestMIGWithAnAgentOfVersion1(t *testing.T) {
	e := newEnv(t)
	node, a := e.quietNode("v1", "A100-80GB,1xA100-40GB:mig=1g.5gb", 1, nil)
	a.InventoryVersion = gpuinfo.InventoryVersion1
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	n, err := e.client.CoreV1().Nodes().Get(e.tCtx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inv, err := gpuinfo.DecodeInventory(n.Annotations[gpuinfo.InventoryAnnotation]); err != nil || inv.Version != 1 || inv.Cards[1].MIG != nil || !inv.Cards[1].MIGEnabled {
		t.Fatalf("the agent published %v (%v), want version 1 with card 1 in MIG mode and no slices", n.Annotations[gpuinfo.InventoryAnnotation], err)
	}
	ctx, cancel := context.WithCancel(e.tCtx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	e.tCtx.Cleanup(func() { cancel(); <-done })
	e.startScheduler()
	e.create(e.podSpec("share", "tessera-binpack", share4GiB30))
	if got := placementOf(t, e.waitBound(30*time.Second, "share")["share"]); got.Node != node || !cmp.Equal(got.Cards, []int{0}) {
		t.Errorf("the share went to %+v, want card 0 of %s", got, node)
	}
	e.create(e.migPod("slice", "mig", 4000))
	if msg := e.waitUnschedulable("slice"); !strings.Contains(msg, "no GPU in MIG mode with a healthy slice") {
		t.Errorf("pending message %q does not say that no card offers a slice", msg)
	}
}
