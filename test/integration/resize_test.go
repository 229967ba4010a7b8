package integration

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/hamicore"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	noderesize "github.com/tessera-gpu/tessera/node-agent/resize"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/resize"
)

// l4MiB is the memory of a simulated L4 card.
const l4MiB = 23034

// resizes drives GPUShareResizes in the test's namespace: it asks for them
// as a tenant and reads their outcome.
type resizes struct {
	e      *env
	tenant dynamic.ResourceInterface
}

func (e *env) resizes() *resizes {
	return &resizes{e: e, tenant: dynamicAs(e.tCtx, controlPlane.Config).Resource(resizev1alpha1.Resource).Namespace(e.ns)}
}

// runtimeView plays the container runtime's side of a node for the node
// agent's resize applier: the containers running with their shares (NRI's
// view) and what their processes use (NVML's). A measurement waits while
// gate is set, until it is closed.
type runtimeView struct {
	mu      sync.Mutex
	running []nri.Running
	usedMiB map[string]int64 // by card UUID
	gate    chan struct{}
}

func (v *runtimeView) Running() []nri.Running {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.running)
}

func (v *runtimeView) Resized(id string, cards []gpuinfo.CardAssignment) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range v.running {
		if v.running[i].ID == id {
			v.running[i].Holdings = []enforce.Holding{{Key: enforce.ContainerKey(id), Cards: cards}}
			return true
		}
	}
	return false
}

func (v *runtimeView) Use(string) (map[string]int64, error) {
	v.mu.Lock()
	gate, used := v.gate, maps.Clone(v.usedMiB)
	v.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return used, nil
}

func (v *runtimeView) set(used int64, gate chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, h := range v.running[0].Holdings {
		for _, c := range h.Cards {
			v.usedMiB[c.UUID] = used
		}
	}
	v.gate = gate
}

// limitMiB is the memory limit of card 0 in the region at path, in MiB.
func (e *env) limitMiB(path string) uint64 {
	e.tCtx.Helper()
	mem, _, err := hamicore.RegionLimits(path, 0)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return mem >> 20
}

// ask creates a resize of the pod's container main to memoryMiB.
func (rs *resizes) ask(name, pod string, memoryMiB int64) {
	rs.e.tCtx.Helper()
	r := resizeObject(name, pod, map[string]any{"memory": fmt.Sprintf("%dMi", memoryMiB)})
	if _, err := rs.tenant.Create(rs.e.tCtx, r, metav1.CreateOptions{}); err != nil {
		rs.e.tCtx.Fatal(err)
	}
}

// get reads a resize.
func (rs *resizes) get(name string) *resizev1alpha1.GPUShareResize {
	rs.e.tCtx.Helper()
	u, err := rs.tenant.Get(rs.e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		rs.e.tCtx.Fatal(err)
	}
	r := &resizev1alpha1.GPUShareResize{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err != nil {
		rs.e.tCtx.Fatal(err)
	}
	return r
}

// waitPending waits until the resize waits for the node agent, and returns
// it.
func (rs *resizes) waitPending(name string) *resizev1alpha1.GPUShareResize {
	rs.e.tCtx.Helper()
	var r *resizev1alpha1.GPUShareResize
	rs.e.waitFor(30*time.Second, "resize "+name+" to wait for the node agent", func() (bool, error) {
		r = rs.get(name)
		c := meta.FindStatusCondition(r.Status.Conditions, resizev1alpha1.ConditionPending)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == resize.ReasonWaitingForNodeAgent, nil
	})
	return r
}

// outcome waits until the resize is applied or refused and returns which
// ("Applied" or "Refused") with the condition's reason and message.
func (rs *resizes) outcome(name string) (string, string, string) {
	rs.e.tCtx.Helper()
	var kind, reason, message string
	rs.e.waitFor(30*time.Second, "resize "+name+" to be decided", func() (bool, error) {
		r := rs.get(name)
		for _, k := range []string{resizev1alpha1.ConditionApplied, resizev1alpha1.ConditionRefused} {
			if c := meta.FindStatusCondition(r.Status.Conditions, k); c != nil && c.Status == metav1.ConditionTrue {
				kind, reason, message = k, c.Reason, c.Message
				return true, nil
			}
		}
		return false, nil
	})
	return kind, reason, message
}

// memoryOf is the memory the pod's container main holds on its first card,
// as its assignment says.
func (e *env) memoryOf(pod string) int64 {
	e.tCtx.Helper()
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, pod, metav1.GetOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return e.assignment(p).Containers["main"][0].MemoryMiB
}

// assignment decodes a placed pod's assignment.
func (e *env) assignment(p *v1.Pod) *gpuinfo.Assignment {
	e.tCtx.Helper()
	a, err := gpuinfo.DecodeAssignment(p.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		e.tCtx.Fatalf("pod %s: %v", p.Name, err)
	}
	return a
}

// checkCardsHold checks the oracle: on every card, the memory the live
// pods' assignments give is at most the card's.
func (e *env) checkCardsHold(capacityMiB int64) {
	e.tCtx.Helper()
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	held := map[string]int64{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if _, ok := p.Annotations[gpuinfo.AssignmentAnnotation]; !ok || p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		for _, cards := range e.assignment(p).Containers {
			for _, c := range cards {
				held[c.UUID] += c.MemoryMiB
			}
		}
	}
	for uuid, mib := range held {
		if mib > capacityMiB {
			e.tCtx.Errorf("card %s: the pods' assignments give %d MiB of %d", uuid, mib, capacityMiB)
		}
	}
}

// TestResize runs GPUShareResizes through the scheduler's resize controller
// and the node agent's applier on one L4 card (23034 MiB) held by a notebook
// (8192 MiB, 30% compute) and a filler (12000 MiB); the test plays the
// container runtime (the notebook's container and its shared region, in the
// layout of the pinned HAMi-core) and NVML (what it uses). A shrink lowers
// the region's limit, is recorded only once the agent has measured the use,
// and the room it frees goes to a pod waiting for it; growing back is refused
// while that pod holds the room, and applied once the filler leaves; a share
// beyond the pod's request, a shrink below what the container uses (its
// limit put back) and a missing pod are refused. No card's assignments ever
// add up to more than it has.
func TestResize(t *testing.T) {
	e := newEnv(t)
	node := e.node("a", cluster.L4, 1, nil)
	e.startScheduler()
	e.create(e.podSpec("notebook", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 30}))
	e.create(e.podSpec("filler", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 12000, "tessera.io/gpu-cores": 30}))
	notebook := e.waitBound(30*time.Second, "notebook", "filler")["notebook"]
	// 2842 MiB free: the waiter's 4096 do not fit.
	e.create(e.podSpec("waiter", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 10}))
	e.waitUnschedulable("waiter")

	// The notebook's container runs on the node with its region.
	const id = "ctr-notebook"
	regions := t.TempDir()
	regionPath := filepath.Join(regions, enforce.RegionName(id))
	if err := hamicore.WriteRegion(regionPath, 1, 2, []uint64{8192 << 20}, []uint64{30}, nil); err != nil {
		t.Fatal(err)
	}
	view := &runtimeView{usedMiB: map[string]int64{}, running: []nri.Running{{
		ID:       id,
		Owner:    nri.Owner{Namespace: e.ns, Pod: "notebook", PodUID: notebook.UID, Container: "main"},
		Holdings: []enforce.Holding{{Key: enforce.ContainerKey(id), Cards: e.assignment(notebook).Containers["main"]}},
	}}}
	applier := &noderesize.Applier{Node: node, Client: dynamicAs(e.tCtx, install.AsAgent(controlPlane.Config, node)),
		RegionDir: regions, Running: view.Running, Resized: view.Resized, Use: view.Use, Pod: e.podGetter(), ReconcileInterval: 100 * time.Millisecond}
	go applier.Run(e.tCtx)
	rs := e.resizes()

	// A shrink: the limit is lowered first, the share recorded after the
	// use is measured.
	measured := make(chan struct{})
	view.set(2000, measured)
	rs.ask("idle", "notebook", 4096)
	pending := rs.waitPending("idle")
	if pending.Status.NodeName != node || len(pending.Status.To) != 1 || pending.Status.To[0].MemoryMiB != 4096 || pending.Status.From[0].MemoryMiB != 8192 {
		t.Errorf("the shrink's status: node %q, from %+v, to %+v", pending.Status.NodeName, pending.Status.From, pending.Status.To)
	}
	e.waitFor(30*time.Second, "the region's limit to be lowered", func() (bool, error) { return e.limitMiB(regionPath) == 4096, nil })
	if got := e.memoryOf("notebook"); got != 8192 {
		t.Errorf("before the use is measured the notebook holds %d MiB, want 8192", got)
	}
	close(measured)
	if kind, reason, msg := rs.outcome("idle"); kind != resizev1alpha1.ConditionApplied {
		t.Fatalf("shrink: %s (%s: %s), want Applied", kind, reason, msg)
	}
	if got := e.memoryOf("notebook"); got != 4096 {
		t.Errorf("after the shrink the notebook holds %d MiB, want 4096", got)
	}
	e.waitBound(30*time.Second, "waiter")
	e.checkCardsHold(l4MiB)

	// Growing back: the waiter holds the room now.
	rs.ask("restore", "notebook", 8192)
	if kind, reason, msg := rs.outcome("restore"); kind != resizev1alpha1.ConditionRefused || reason != resize.ReasonNoRoom {
		t.Errorf("grow into a full card: %s (%s: %s), want Refused (%s)", kind, reason, msg, resize.ReasonNoRoom)
	}
	rs.ask("beyond", "notebook", 9000)
	if kind, reason, msg := rs.outcome("beyond"); kind != resizev1alpha1.ConditionRefused || reason != resize.ReasonBeyondRequest {
		t.Errorf("grow beyond the request: %s (%s: %s), want Refused (%s)", kind, reason, msg, resize.ReasonBeyondRequest)
	}
	rs.ask("nobody", "no-such-pod", 1024)
	if kind, reason, msg := rs.outcome("nobody"); kind != resizev1alpha1.ConditionRefused || reason != resize.ReasonPodNotFound {
		t.Errorf("resize of a missing pod: %s (%s: %s), want Refused (%s)", kind, reason, msg, resize.ReasonPodNotFound)
	}
	if got, limit := e.memoryOf("notebook"), e.limitMiB(regionPath); got != 4096 || limit != 4096 {
		t.Errorf("after refused grows the notebook holds %d MiB and its limit is %d MiB, want 4096 and 4096", got, limit)
	}

	// Once the filler leaves, the grow is applied.
	// At once, as a kubelet confirms a pod's end.
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, "filler", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(30*time.Second, "the filler to go", func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, "filler", metav1.GetOptions{})
		return err != nil, nil
	})
	rs.ask("restore-again", "notebook", 8192)
	if kind, reason, msg := rs.outcome("restore-again"); kind != resizev1alpha1.ConditionApplied {
		t.Errorf("grow: %s (%s: %s), want Applied", kind, reason, msg)
	}
	if got, limit := e.memoryOf("notebook"), e.limitMiB(regionPath); got != 8192 || limit != 8192 {
		t.Errorf("after the grow the notebook holds %d MiB and its limit is %d MiB, want 8192 and 8192", got, limit)
	}
	e.checkCardsHold(l4MiB)

	// The container uses more than the shrink would leave.
	view.set(3000, nil)
	rs.ask("too-small", "notebook", 1024)
	kind, reason, msg := rs.outcome("too-small")
	if kind != resizev1alpha1.ConditionRefused || reason != noderesize.ReasonInUse || !strings.Contains(msg, "3000 MiB of card 0") {
		t.Errorf("a shrink below the use: %s (%s: %s), want Refused (%s) naming the use", kind, reason, msg, noderesize.ReasonInUse)
	}
	if got, limit := e.memoryOf("notebook"), e.limitMiB(regionPath); got != 8192 || limit != 8192 {
		t.Errorf("after a refused shrink the notebook holds %d MiB and its limit is %d MiB, want 8192 and 8192", got, limit)
	}
	if held := view.Running()[0].Holdings[0].Cards[0].MemoryMiB; held != 8192 {
		t.Errorf("the agent's view of the notebook's share: %d MiB, want 8192", held)
	}
	e.checkCardsHold(l4MiB)

	// An agent restarted reads the share back from the container's
	// environment (the 4096 MiB it started with, no card index), and a
	// process of the container raised its own limit: both are brought back
	// to the pod's assignment.
	view.mu.Lock()
	view.running[0].Holdings[0].Cards = []gpuinfo.CardAssignment{{Index: -1, UUID: view.running[0].Holdings[0].Cards[0].UUID, MemoryMiB: 4096, Cores: 30}}
	view.mu.Unlock()
	if err := hamicore.WriteRegion(regionPath, 1, 2, []uint64{20000 << 20}, []uint64{30}, nil); err != nil {
		t.Fatal(err)
	}
	e.waitFor(30*time.Second, "the view and the region to be brought back to 8192 MiB", func() (bool, error) {
		card := view.Running()[0].Holdings[0].Cards[0]
		return card.MemoryMiB == 8192 && card.Index == 0 && e.limitMiB(regionPath) == 8192, nil
	})
}

// podGetter reads pods of the test's namespace as the agent's cache does.
func (e *env) podGetter() func(context.Context, string, string) (*v1.Pod, error) {
	return func(ctx context.Context, namespace, name string) (*v1.Pod, error) {
		return e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}

// TestResizesRacePlacements: grows and placements racing for the same
// cards never over-commit one. Four notebooks asking 8192 MiB each hold two
// L4 cards (23034 MiB) in pairs, shrunk to 2048 MiB (the node's agent
// applies resizes over a simulated runtime); then, all at once, each is
// grown back to its request while four 6000 MiB pods arrive: both cannot
// fit. The reference is the pods' assignments, summed card by card.
func TestResizesRacePlacements(t *testing.T) {
	e := newEnv(t)
	node := e.node("a", cluster.L4, 2, nil)
	e.startScheduler()
	if err := controlPlane.RunResizes(e.tCtx, node, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var notebooks []string
	for i := range 4 {
		name := fmt.Sprintf("notebook-%d", i)
		notebooks = append(notebooks, name)
		e.create(e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 10}))
	}
	e.waitBound(30*time.Second, notebooks...)
	rs := e.resizes()
	for _, n := range notebooks {
		rs.ask(n+"-idle", n, 2048)
	}
	for _, n := range notebooks {
		if kind, reason, msg := rs.outcome(n + "-idle"); kind != resizev1alpha1.ConditionApplied {
			t.Fatalf("shrinking %s: %s (%s: %s)", n, kind, reason, msg)
		}
	}
	var wg sync.WaitGroup
	for i, n := range notebooks {
		wg.Add(2)
		go func() {
			defer wg.Done()
			rs.ask(n+"-busy", n, 8192)
		}()
		go func() {
			defer wg.Done()
			e.create(e.podSpec(fmt.Sprintf("arrival-%d", i), "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 6000, "tessera.io/gpu-cores": 10}))
		}()
	}
	wg.Wait()
	grown := 0
	for _, n := range notebooks {
		kind, reason, _ := rs.outcome(n + "-busy")
		switch {
		case kind == resizev1alpha1.ConditionApplied:
			grown++
		case reason != resize.ReasonNoRoom:
			t.Errorf("growing %s: %s (%s), want Applied or refused for want of room", n, kind, reason)
		}
	}
	e.waitFor(30*time.Second, "every arrival to be bound or found unschedulable", func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, "arrival-") && p.Spec.NodeName == "" && !unschedulable(&p) {
				return false, nil
			}
		}
		return true, nil
	})
	e.checkCardsHold(l4MiB)
	t.Logf("%d of 4 grows applied", grown)
}
