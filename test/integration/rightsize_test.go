package integration

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/resize"
)

// reporter plays a node agent's use report: its Lease carries the report
// set last, written by the agent's own publisher under the agent's
// identity.
type reporter struct {
	e      *env
	agent  *agent.Agent
	mu     sync.Mutex
	report *gpuinfo.UseReport
	last   time.Time
}

// reportingNode is a simulated node whose agent reports the use the test
// sets.
func (e *env) reportingNode(suffix string, spec cluster.CardSpec) (string, *reporter) {
	e.tCtx.Helper()
	name, a := e.quietNode(suffix, spec, 1, nil)
	r := &reporter{e: e, agent: a}
	a.Publisher.Use = func() (string, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.report == nil {
			return "", nil
		}
		return r.report.Encode()
	}
	ctx, cancel := context.WithCancel(e.tCtx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	e.tCtx.Cleanup(func() { cancel(); <-done })
	return name, r
}

// set reports that the pod's container main uses useMiB, with peakMiB over
// the last window, and renews the Lease at once.
func (r *reporter) set(pod *v1.Pod, useMiB, peakMiB int64, window time.Duration) {
	r.e.tCtx.Helper()
	r.mu.Lock()
	r.report = &gpuinfo.UseReport{Containers: []gpuinfo.ContainerUse{{Namespace: pod.Namespace, Pod: pod.Name, UID: pod.UID,
		Container: "main", UseMiB: useMiB, PeakMiB: peakMiB, WindowSeconds: int64(window / time.Second)}}}
	r.mu.Unlock()
	r.renew()
}

// renew writes the Lease, as the agent's next heartbeat would.
func (r *reporter) renew() {
	r.e.tCtx.Helper()
	if err := r.agent.Publisher.Heartbeat(r.e.tCtx); err != nil {
		r.e.tCtx.Fatal(err)
	}
	r.last = time.Now()
}

// rightSizes lists the resizes right-sizing created for the pod with the
// action, oldest first.
func (rs *resizes) rightSizes(pod, action string) []*resizev1alpha1.GPUShareResize {
	rs.e.tCtx.Helper()
	list, err := rs.tenant.List(rs.e.tCtx, metav1.ListOptions{LabelSelector: resizev1alpha1.RightSizeLabel + "=" + action})
	if err != nil {
		rs.e.tCtx.Fatal(err)
	}
	var out []*resizev1alpha1.GPUShareResize
	for _, u := range list.Items {
		if r := rs.get(u.GetName()); r.Spec.PodName == pod {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *resizev1alpha1.GPUShareResize) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return out
}

// TestRightSizing: a notebook opted in to right-sizing (quiet period one
// minute) holds 16000 MiB of an L4 card (23034 MiB); a pod asking 18000
// waits. Its node's agent reports a peak of 1500 MiB over the minute: the
// controller shrinks the share to 2048 MiB (the peak plus a quarter,
// rounded up to 256 MiB) through a resize the node's agent applies, and the
// waiting pod takes the room. Use near the smaller limit asks for the
// request back: refused while the room is held, applied once it is free.
// An agent of another node reporting on the notebook is not listened to. No
// card's assignments ever add up to more than it has.
func TestRightSizing(t *testing.T) {
	e := newEnv(t)
	node, agentA := e.reportingNode("a", cluster.L4)
	// A T4 (16 GiB) cannot hold the waiter: its agent is the intruder.
	other, agentB := e.reportingNode("b", cluster.T4)
	e.startScheduler()
	if err := controlPlane.RunResizes(e.tCtx, node, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	spec := e.podSpec("notebook", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 16000, "tessera.io/gpu-cores": 30})
	spec.Annotations = map[string]string{gpuinfo.RightSizeAnnotation: "1m", gpuinfo.ModelAnnotation: "L4"}
	e.create(spec)
	notebook := e.waitBound(30*time.Second, "notebook")["notebook"]
	e.create(e.podSpec("waiter", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 18000, "tessera.io/gpu-cores": 10}))
	e.waitUnschedulable("waiter")
	rs := e.resizes()

	// The other node's agent would have the notebook shrunk to 512 MiB;
	// its report is read first (the Leases' order), and ignored.
	agentB.set(notebook, 0, 100, time.Minute)
	agentA.set(notebook, 1000, 1500, time.Minute)
	var shrink *resizev1alpha1.GPUShareResize
	e.waitFor(30*time.Second, "right-sizing to shrink the notebook", func() (bool, error) {
		if got := rs.rightSizes("notebook", "shrink"); len(got) > 0 {
			shrink = got[0]
		}
		return shrink != nil, nil
	})
	if got := shrink.Spec.Memory.Value() >> 20; got != 2048 {
		t.Fatalf("right-sizing shrinks to %d MiB, want 2048: the report of node %s was listened to?", got, other)
	}
	if kind, reason, msg := rs.outcome(shrink.Name); kind != resizev1alpha1.ConditionApplied {
		t.Fatalf("the shrink: %s (%s: %s), want Applied", kind, reason, msg)
	}
	if got := e.memoryOf("notebook"); got != 2048 {
		t.Errorf("after the shrink the notebook holds %d MiB, want 2048", got)
	}
	e.waitBound(30*time.Second, "waiter")
	e.checkCardsHold(l4MiB)
	e.waitFor(30*time.Second, "the decision's Event on the notebook", func() (bool, error) {
		return e.eventsFor("notebook", "GPUShareRightSizing") > 0, nil
	})

	// The notebook wakes: 1900 MiB of 2048 in use. The waiter holds the
	// room, so the restore is refused; once it leaves, right-sizing asks
	// again (as the agent keeps reporting) and the request comes back.
	agentA.set(notebook, 1900, 1900, time.Minute)
	var restores []*resizev1alpha1.GPUShareResize
	e.waitFor(30*time.Second, "right-sizing to restore the notebook", func() (bool, error) {
		restores = rs.rightSizes("notebook", "restore")
		return len(restores) > 0, nil
	})
	if got := restores[0].Spec.Memory.Value() >> 20; got != 16000 {
		t.Fatalf("right-sizing restores to %d MiB, want the request, 16000", got)
	}
	if kind, reason, msg := rs.outcome(restores[0].Name); kind != resizev1alpha1.ConditionRefused || reason != resize.ReasonNoRoom {
		t.Errorf("a restore into a full card: %s (%s: %s), want Refused (%s)", kind, reason, msg, resize.ReasonNoRoom)
	}
	e.checkCardsHold(l4MiB)
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, "waiter", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(60*time.Second, "the notebook's request to come back", func() (bool, error) {
		if time.Since(agentA.last) > time.Second {
			agentA.renew()
		}
		return e.memoryOf("notebook") == 16000, nil
	})
	restores = rs.rightSizes("notebook", "restore")
	if kind, reason, msg := rs.outcome(restores[len(restores)-1].Name); kind != resizev1alpha1.ConditionApplied {
		t.Errorf("the last restore: %s (%s: %s), want Applied", kind, reason, msg)
	}
	all := append(rs.rightSizes("notebook", "shrink"), restores...)
	for _, r := range all {
		if len(r.OwnerReferences) != 1 || r.OwnerReferences[0].UID != notebook.UID {
			t.Errorf("resize %s is owned by %v, want the notebook (it goes with the pod)", r.Name, r.OwnerReferences)
		}
	}
	e.checkCardsHold(l4MiB)
}

// eventsFor counts the Events with reason on the pod.
func (e *env) eventsFor(pod, reason string) int {
	e.tCtx.Helper()
	list, err := e.client.EventsV1().Events(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.Regarding.Name == pod && ev.Reason == reason {
			n++
		}
	}
	return n
}
