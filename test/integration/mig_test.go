package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/cluster"
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
	slicePod := func(name, isolation string, memoryMiB int64) {
		pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": memoryMiB})
		pod.Annotations = map[string]string{gpuinfo.IsolationAnnotation: isolation}
		e.create(pod)
	}
	slicePod("own", "mig", 8000)
	slicePod("share-a", "mig-shared", 2000)
	slicePod("share-b", "mig-shared", 2000)
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
	slicePod("too-big", "mig", 30000)
	if msg := e.waitUnschedulable("too-big"); !strings.Contains(msg, "GPUs: the pod needs 1 MIG slice with 30000 MiB") ||
		!strings.Contains(msg, "1 node with at most 19968 MiB in a free MIG slice") {
		t.Errorf("pending message %q does not say that no free slice holds 30000 MiB", msg)
	}
	e.checkNoOvercommit(t)
}
