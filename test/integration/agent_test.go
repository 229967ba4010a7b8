package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/health"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestAgentPublishesInventoryAndHeartbeat runs the node agent's publishing
// against the real API server with the simulated backend, as the node's
// agent, and the scheduler on what it published.
func TestAgentPublishesInventoryAndHeartbeat(t *testing.T) {
	e := newEnv(t)
	name := e.agentNode("agent", 3)
	// The scheduler reads this Lease: the clock must be near the real one.
	clock := time.Now().Truncate(time.Second)
	pub := &publish.Publisher{Client: e.agentClient(name), NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second, Now: func() time.Time { return clock }}
	backend := func(spec string) discovery.Backend {
		b, err := discovery.NewSimulated(name, spec)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := &agent.Agent{Backend: backend("2xL4-24GB"), Publisher: pub}
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	node, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := gpuinfo.DecodeInventory(node.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil || len(inv.Cards) != 2 {
		t.Fatalf("published inventory = %+v, %v; want 2 cards", inv, err)
	}

	// Unchanged cards: no node write, but the lease is renewed.
	clock = clock.Add(10 * time.Second)
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	again, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != node.ResourceVersion {
		t.Errorf("the node was written although its cards did not change (%s -> %s)", node.ResourceVersion, again.ResourceVersion)
	}
	lease, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, pub.LeaseName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !lease.Spec.RenewTime.Time.Equal(clock) || *lease.Spec.HolderIdentity != name || lease.OwnerReferences[0].UID != node.UID {
		t.Errorf("lease = %+v, want renewed at %v, held by and owned by the node", lease.Spec, clock)
	}

	// A card appears (hot-plug): the inventory follows, and the scheduler
	// places a pod that needs all three.
	a.Backend = backend("3xL4-24GB")
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	e.startScheduler()
	e.create(e.podSpec("three", "tessera-binpack", map[string]int64{"tessera.io/gpu": 3}))
	if p := placementOf(t, e.waitBound(30*time.Second, "three")["three"]); p.Node != name || len(p.Cards) != 3 {
		t.Errorf("placement %+v, want 3 cards on %s", p, name)
	}

	// A critical XID on card 2 marks it unhealthy in the published inventory;
	// the pod already on it is left running.
	a.Health = health.NewTracker(10*time.Minute, func() time.Time { return clock })
	a.Health.ObserveXID("GPU-sim-"+name+"-2", 79)
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	node, err = e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err = gpuinfo.DecodeInventory(node.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil || inv.Cards[2].Healthy || !inv.Cards[1].Healthy {
		t.Errorf("inventory after XID 79 on card 2 = %+v, %v", inv, err)
	}
	if p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, "three", metav1.GetOptions{}); err != nil || p.Spec.NodeName != name {
		t.Errorf("the pod on the unhealthy card was disturbed: %v", err)
	}
	events, err := e.client.EventsV1().Events(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	told := false
	for _, ev := range events.Items {
		told = told || (ev.Reason == publish.ReasonGPUUnhealthy && ev.Regarding.Name == "three" && strings.Contains(ev.Note, "XID 79"))
	}
	if !told {
		t.Error("no GPUUnhealthy event on the pod holding the card")
	}
}

// TestSilentAgentNodeGetsNoPodsUntilItReports: a node whose agent's Lease is
// stale gets no GPU pods, says why, and the waiting pod is bound as soon as
// the agent renews its Lease.
func TestSilentAgentNodeGetsNoPodsUntilItReports(t *testing.T) {
	e := newEnv(t)
	name, _ := e.quietNode("quiet", cluster.A100, 1, nil)
	past := time.Now().Add(-10 * time.Minute)
	pub := &publish.Publisher{Client: e.agentClient(name), NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second, Now: func() time.Time { return past }}
	if err := pub.Heartbeat(e.tCtx); err != nil {
		t.Fatal(err)
	}
	e.startScheduler()
	e.create(e.podSpec("waiting", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	if msg := e.waitUnschedulable("waiting"); !strings.Contains(msg, "1 node with a GPU agent not reporting ("+name+" for 10m") {
		t.Errorf("message %q does not name the silent agent", msg)
	}
	pub.Now = time.Now
	if err := pub.Heartbeat(e.tCtx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.waitBound(5*time.Second, "waiting")
	t.Logf("bound %v after the agent reported again", time.Since(start).Round(time.Millisecond))
}

// enforcement is a node agent's NRI side as the agent sees it: ready or not,
// with a reason.
type enforcement struct {
	mu       sync.Mutex
	reason   string
	changesC chan struct{}
}

func (f *enforcement) NotReady() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

func (f *enforcement) Changes() <-chan struct{} { return f.changesC }

func (f *enforcement) set(reason string) {
	f.mu.Lock()
	f.reason = reason
	f.mu.Unlock()
	f.changesC <- struct{}{}
}

// TestUnenforcedNodeGetsNoGPUPods: when a node's agent loses its NRI
// connection it says so on its Lease at once, and records a Warning Event on
// the Node; the scheduler places no GPU pod there, says why, and binds the
// waiting pod as soon as the agent enforces again.
func TestUnenforcedNodeGetsNoGPUPods(t *testing.T) {
	e := newEnv(t)
	name := e.plainNode("nri")
	backend, err := discovery.NewSimulated(name, "1xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	nri := &enforcement{changesC: make(chan struct{}, 1)}
	a := &agent.Agent{
		Backend:     backend,
		Publisher:   &publish.Publisher{Client: e.agentClient(name), NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second},
		Enforcement: nri, RescanInterval: time.Hour, HeartbeatInterval: time.Hour,
	}
	ctx, stop := context.WithCancel(e.tCtx)
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	defer func() { stop(); <-done }()

	// The connection is lost before the scheduler starts, so that its
	// informers have the Lease before it places anything.
	nri.set("NRI plugin not connected to the container runtime since 2026-12-02T10:00:00Z: connection reset")
	e.waitNodeEvent(name, publish.ReasonEnforcementUnavailable)
	e.waitFor(10*time.Second, "the Lease to say the agent is not ready", func() (bool, error) {
		l, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, gpuinfo.AgentLeasePrefix+name, metav1.GetOptions{})
		return err == nil && l.Annotations[gpuinfo.AgentNotReadyAnnotation] != "", err
	})
	e.startScheduler()
	e.create(e.podSpec("waiting", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024}))
	if msg := e.waitUnschedulable("waiting"); !strings.Contains(msg, "1 node with a GPU agent that cannot enforce assignments ("+name+": NRI plugin not connected") {
		t.Errorf("message %q does not say the node's agent cannot enforce", msg)
	}

	nri.set("")
	start := time.Now()
	e.waitBound(5*time.Second, "waiting")
	t.Logf("bound %v after the agent enforced again", time.Since(start).Round(time.Millisecond))
	e.waitNodeEvent(name, publish.ReasonEnforcementRestored)

	// An agent that stops says so on its way out.
	stop()
	<-done
	lease, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, gpuinfo.AgentLeasePrefix+name, metav1.GetOptions{})
	if err != nil || lease.Annotations[gpuinfo.AgentNotReadyAnnotation] != "node agent stopped" {
		t.Errorf("after the agent stopped, its Lease says %q (%v)", lease.Annotations[gpuinfo.AgentNotReadyAnnotation], err)
	}
}

// waitNodeEvent waits for an Event of that reason on the node.
func (e *env) waitNodeEvent(node, reason string) {
	e.tCtx.Helper()
	e.waitFor(30*time.Second, "a "+reason+" event on node "+node, func() (bool, error) {
		events, err := e.client.EventsV1().Events(metav1.NamespaceDefault).List(e.tCtx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("regarding.name", node).String(),
		})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if ev.Reason == reason {
				return true, nil
			}
		}
		return false, nil
	})
}

// failingBackend reads its cards from a simulated backend until told to
// fail, as NVML does when the driver goes away.
type failingBackend struct {
	discovery.Backend
	failing bool
}

func (b *failingBackend) Cards() ([]discovery.Card, error) {
	if b.failing {
		return nil, errors.New("NVML: driver not loaded")
	}
	return b.Backend.Cards()
}

// TestAgentPublishesUnreadableCardsUnhealthy: when a scan fails, the cards
// last read are published unhealthy — so a card a critical XID marked is
// never left published healthy — and the heartbeat goes on.
func TestAgentPublishesUnreadableCardsUnhealthy(t *testing.T) {
	e := newEnv(t)
	name := e.plainNode("lost")
	sim, err := discovery.NewSimulated(name, "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	backend := &failingBackend{Backend: sim}
	a := &agent.Agent{
		Backend:   backend,
		Health:    health.NewTracker(10*time.Minute, time.Now),
		Publisher: &publish.Publisher{Client: e.agentClient(name), NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second},
	}
	if err := a.Once(e.tCtx); err != nil {
		t.Fatal(err)
	}
	a.Health.ObserveXID("GPU-sim-"+name+"-1", 79)
	backend.failing = true
	if err := a.Once(e.tCtx); err == nil || !strings.Contains(err.Error(), "driver not loaded") {
		t.Errorf("a failed scan was not reported: %v", err)
	}
	node, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := gpuinfo.DecodeInventory(node.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil || len(inv.Cards) != 2 || inv.Cards[0].Healthy || inv.Cards[1].Healthy {
		t.Errorf("inventory after a failed scan = %+v, %v; want both cards, unhealthy", inv, err)
	}
	lease, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, gpuinfo.AgentLeasePrefix+name, metav1.GetOptions{})
	if err != nil || lease.Spec.RenewTime == nil {
		t.Errorf("no heartbeat after the failed scan: %v", err)
	}
}

// xidBackend is a simulated backend whose cards can change and which
// delivers XID events the test injects, recording each watch it starts.
type xidBackend struct {
	mu      sync.Mutex
	backend discovery.Backend
	watches []chan func(uuid string, xid uint64)
}

func (b *xidBackend) Name() string { return "xid-test" }
func (b *xidBackend) Close() error { return nil }
func (b *xidBackend) Cards() ([]discovery.Card, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.backend.Cards()
}

func (b *xidBackend) WatchXIDs(ctx context.Context, report func(uuid string, xid uint64)) error {
	ch := make(chan func(string, uint64), 1)
	ch <- report
	b.mu.Lock()
	b.watches = append(b.watches, ch)
	b.mu.Unlock()
	<-ctx.Done()
	return nil
}

// watch returns the report function of the n-th watch, once it started.
func (b *xidBackend) watch(e *env, n int) func(string, uint64) {
	var report func(string, uint64)
	e.waitFor(10*time.Second, fmt.Sprint("XID watch ", n), func() (bool, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.watches) <= n {
			return false, nil
		}
		select {
		case report = <-b.watches[n]:
		default:
		}
		return report != nil, nil
	})
	return report
}

// TestXIDWatchFollowsTheCards: a card that appears after the agent started
// is watched for XIDs too, and its critical XID is published.
func TestXIDWatchFollowsTheCards(t *testing.T) {
	e := newEnv(t)
	name := e.agentNode("xid", 2)
	sim := func(spec string) discovery.Backend {
		b, err := discovery.NewSimulated(name, spec)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	backend := &xidBackend{backend: sim("1xL4-24GB")}
	a := &agent.Agent{
		Backend:   backend,
		Health:    health.NewTracker(10*time.Minute, time.Now),
		Publisher: &publish.Publisher{Client: e.agentClient(name), NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second},
	}
	ctx, cancel := context.WithCancel(e.tCtx)
	defer cancel()
	if err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	backend.watch(e, 0)
	backend.mu.Lock()
	backend.backend = sim("2xL4-24GB") // hot-plug
	backend.mu.Unlock()
	if err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	backend.watch(e, 1)("GPU-sim-"+name+"-1", 79)
	if err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	node, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := gpuinfo.DecodeInventory(node.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil || len(inv.Cards) != 2 || !inv.Cards[0].Healthy || inv.Cards[1].Healthy {
		t.Errorf("inventory after an XID on the new card = %+v, %v; want card 1 unhealthy", inv, err)
	}
}

// TestAgentPodCacheHoldsUnfinishedPods: the agent's pod cache, read as the
// agent (its RBAC), holds the pods bound to its node that have not finished,
// cut to what it reads: a pod that succeeds or fails leaves it.
func TestAgentPodCacheHoldsUnfinishedPods(t *testing.T) {
	e := newEnv(t)
	node := e.plainNode("cache")
	var names []string
	for _, name := range []string{"running", "done", "failing"} {
		pod := e.podSpec(name, "", nil)
		pod.Spec.NodeName = node
		pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "LARGE", Value: strings.Repeat("x", 1000)}}
		e.create(pod)
		names = append(names, name)
	}
	setPhase := func(name string, phase v1.PodPhase) {
		t.Helper()
		pod, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = phase
		if _, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(e.tCtx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPhase("done", v1.PodSucceeded)
	ctx, cancel := context.WithCancel(e.tCtx)
	defer cancel()
	lister, err := nri.PodsOnNode(ctx, e.agentClient(node), node, nil)
	if err != nil {
		t.Fatal(err)
	}
	cached := func() []string {
		pods, _ := lister.Pods(e.ns).List(labels.Everything())
		var got []string
		for _, p := range pods {
			if len(p.Spec.Containers[0].Env) != 0 {
				t.Errorf("pod %s cached with its environment", p.Name)
			}
			got = append(got, p.Name)
		}
		slices.Sort(got)
		return got
	}
	if diff := cmp.Diff([]string{"failing", "running"}, cached()); diff != "" {
		t.Errorf("cached pods (-want,+got):\n%s", diff)
	}
	setPhase("failing", v1.PodFailed)
	if err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return slices.Equal(cached(), []string{"running"}), nil
	}); err != nil {
		t.Errorf("a pod that failed stays cached: %v", cached())
	}
}

// TestHeartbeatRenewsWithOneUpdate: the agent renews its Lease by updating
// what its last write returned; a Lease changed meanwhile (a conflict) or
// deleted is read again or created, and the renewal still lands.
func TestHeartbeatRenewsWithOneUpdate(t *testing.T) {
	e := newEnv(t)
	node := e.plainNode("beat")
	pub := &publish.Publisher{Client: e.agentClient(node), NodeName: node, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
	leases := e.client.CoordinationV1().Leases(manifests.Namespace)
	renewTime := func() time.Time {
		l, err := leases.Get(e.tCtx, pub.LeaseName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Spec.RenewTime.Time
	}
	if err := pub.Heartbeat(e.tCtx); err != nil {
		t.Fatal(err)
	}
	last := renewTime()
	for _, change := range []struct {
		what string
		do   func()
	}{
		{"nothing", func() {}},
		{"a label added by someone else (a conflict)", func() {
			l, err := leases.Get(e.tCtx, pub.LeaseName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l.Labels = map[string]string{"seen-by": "admin"}
			if _, err := leases.Update(e.tCtx, l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the Lease deleted", func() {
			if err := leases.Delete(e.tCtx, pub.LeaseName(), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		change.do()
		if err := pub.Heartbeat(e.tCtx); err != nil {
			// A conflict or a deletion costs one failed renewal at most.
			if err := pub.Heartbeat(e.tCtx); err != nil {
				t.Fatalf("after %s: %v", change.what, err)
			}
		}
		if now := renewTime(); !now.After(last) {
			t.Errorf("after %s the Lease was not renewed (%v, then %v)", change.what, last, now)
		} else {
			last = now
		}
	}
}
