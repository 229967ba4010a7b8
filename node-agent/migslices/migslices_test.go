package migslices

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// slicePod is a pod bound to node n holding, in container c, the slice of
// card index (UUID GPU-sim-n-<index>) named "PROFILE@START".
func slicePod(name string, index int, profile string, start int) *v1.Pod {
	a := gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion2, Containers: map[string][]gpuinfo.CardAssignment{"c": {{
		Index: index, UUID: "GPU-sim-n-" + string(rune('0'+index)), MemoryMiB: 1000, Cores: 0,
		MIG: &gpuinfo.MIGSlice{Profile: profile, Start: start},
	}}}}
	raw, err := a.Encode()
	if err != nil {
		panic(err)
	}
	return st.MakePod().Name(name).Namespace("ns").UID(name).Node("n").Annotation(gpuinfo.AssignmentAnnotation, raw).Obj()
}

// slicesOf lists each card's slices, "CARD:PROFILE@START".
func slicesOf(t *testing.T, backend discovery.Backend) []string {
	t.Helper()
	cards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cards {
		if c.MIG == nil {
			continue
		}
		for _, in := range c.MIG.Instances {
			got = append(got, slice{c.Index, in.Profile, in.Start}.String())
		}
	}
	return got
}

// TestReconcile drives a manager over the simulated backend: card 0 is
// dynamic, card 1 static with an operator's slice that no pod holds.
func TestReconcile(t *testing.T) {
	backend, err := discovery.NewSimulated("n", "1xA100-40GB:mig-dynamic=1g.5gb@0,1xA100-40GB:mig=1g.5gb@0")
	if err != nil {
		t.Fatal(err)
	}
	failed := map[string]string{}
	m := New(backend, func(pod *v1.Pod, why string) { failed[pod.Name] = why })
	ctx := context.Background()
	reconcile := func(pods ...*v1.Pod) bool {
		m.SetPods(func() ([]*v1.Pod, error) { return pods, nil })
		cards, err := backend.Cards()
		if err != nil {
			t.Fatal(err)
		}
		return m.Reconcile(ctx, cards)
	}

	// Without the pods, nothing is touched, not even the slice no pod holds.
	cards, _ := backend.Cards()
	if m.Reconcile(ctx, cards) {
		t.Error("reconciled before the pod cache synced")
	}
	// Pods on card 0 get their slices; the dynamic card's unheld slice goes;
	// the static card's stays; a finished pod holds nothing.
	done := slicePod("done", 0, "2g.10gb", 2)
	done.Status.Phase = v1.PodSucceeded
	if !reconcile(slicePod("a", 0, "3g.20gb", 4), slicePod("b", 0, "1g.5gb", 1), done, slicePod("static", 1, "1g.5gb", 3)) {
		t.Error("no change reported")
	}
	want := []string{"card 0, MIG 1g.5gb at slot 1", "card 0, MIG 3g.20gb at slot 4", "card 1, MIG 1g.5gb at slot 0"}
	if diff := cmp.Diff(want, slicesOf(t, backend)); diff != "" {
		t.Errorf("slices (-want,+got):\n%s", diff)
	}
	if len(failed) != 0 {
		t.Errorf("failed pods %v", failed)
	}
	// Unchanged: nothing to do.
	if reconcile(slicePod("a", 0, "3g.20gb", 4), slicePod("b", 0, "1g.5gb", 1)) {
		t.Error("a second pass changed something")
	}
	// A slice overlapping one a pod holds cannot be made: its pod fails.
	reconcile(slicePod("a", 0, "3g.20gb", 4), slicePod("b", 0, "1g.5gb", 1), slicePod("clash", 0, "2g.10gb", 4))
	if why := failed["clash"]; why == "" || failed["a"] != "" {
		t.Errorf("failed pods %v, want clash alone", failed)
	}
	// The last holder gone, its slice goes.
	reconcile(slicePod("b", 0, "1g.5gb", 1))
	if diff := cmp.Diff([]string{"card 0, MIG 1g.5gb at slot 1", "card 1, MIG 1g.5gb at slot 0"}, slicesOf(t, backend)); diff != "" {
		t.Errorf("slices (-want,+got):\n%s", diff)
	}
}

// TestWake: requests for a pass collapse into one.
func TestWake(t *testing.T) {
	m := New(nil, nil)
	m.Wake()
	m.Wake()
	<-m.Changes()
	select {
	case <-m.Changes():
		t.Error("two wake-ups delivered")
	default:
	}
}

// TestPodChanged: only a pod holding a slice, or one not known, asks for a
// pass; a pod of whole cards or without GPUs does not.
func TestPodChanged(t *testing.T) {
	woke := func(pod *v1.Pod) bool {
		m := New(nil, nil)
		m.PodChanged(pod)
		select {
		case <-m.Changes():
			return true
		default:
			return false
		}
	}
	whole := st.MakePod().Name("whole").Annotation(gpuinfo.AssignmentAnnotation, `{"version":1,"containers":{"c":[{"index":0,"uuid":"GPU-0","memoryMiB":1024,"cores":10}]}}`).Obj()
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want bool
	}{
		{"a slice", slicePod("s", 0, "1g.5gb", 6), true},
		{"a share of a whole card", whole, false},
		{"no GPUs", st.MakePod().Name("plain").Obj(), false},
		{"unknown (a missed deletion)", nil, true},
	} {
		if got := woke(tc.pod); got != tc.want {
			t.Errorf("%s: woke %v, want %v", tc.name, got, tc.want)
		}
	}
}
