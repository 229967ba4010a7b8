package gpushare

import (
	"context"
	"fmt"
	"k8s.io/client-go/tools/cache"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	clientsetfake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// harness is a plugin on a framework handle whose informers are fed by a
// fake clientset holding the given objects.
type harness struct {
	ctx       context.Context
	plugin    *Plugin
	client    *clientsetfake.Clientset
	recorder  *events.FakeRecorder
	activator *fakeActivator
	// queue is the scheduling queue, the framework's pod nominator: a
	// nominated pod it does not hold is known by name only.
	queue internalqueue.SchedulingQueue
}

// fakeActivator records the pods the plugin moves back to the active queue.
type fakeActivator struct {
	mu        sync.Mutex
	activated []string
}

func (f *fakeActivator) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range pods {
		f.activated = append(f.activated, k)
	}
}

func (f *fakeActivator) get() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.activated...)
}

func args(nodePolicy, gpuPolicy config.Policy) *config.GPUShareArgs {
	a, err := argsFrom(nil)
	if err != nil {
		panic(err)
	}
	a.NodePolicy, a.GPUPolicy = nodePolicy, gpuPolicy
	return a
}

func newHarness(t testing.TB, a *config.GPUShareArgs, objs ...runtime.Object) *harness {
	t.Helper()
	return harnessOf(t, a, true, objs...)
}

// harnessOf is newHarness; with reporting, every node with an inventory
// and no Lease among objs gets a fresh one (its agent reports), else none.
func harnessOf(t testing.TB, a *config.GPUShareArgs, reporting bool, objs ...runtime.Object) *harness {
	t.Helper()
	tCtx := ktesting.Init(t)
	if reporting {
		leased := map[string]bool{}
		for _, o := range objs {
			if l, ok := o.(*coordinationv1.Lease); ok {
				leased[strings.TrimPrefix(l.Name, gpuinfo.AgentLeasePrefix)] = true
			}
		}
		for _, o := range objs {
			if n, ok := o.(*v1.Node); ok && hasInventory(n) && !leased[n.Name] {
				objs = append(objs, agentLease(n.Name, time.Now()))
			}
		}
	}
	client := clientsetfake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	recorder := events.NewFakeRecorder(100)
	activator := &fakeActivator{}
	var pods []*v1.Pod
	var nodes []*v1.Node
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Pod:
			pods = append(pods, o)
		case *v1.Node:
			nodes = append(nodes, o)
		}
	}
	schedmetrics.Register() // the scheduling queue, the framework's pod nominator, records into them
	queue := internalqueue.NewSchedulingQueue(func(fwk.QueuedEntityInfo, fwk.QueuedEntityInfo) bool { return false }, factory)
	fh, err := frameworkruntime.NewFramework(tCtx, nil, nil,
		frameworkruntime.WithSnapshotSharedLister(internalcache.NewSnapshot(pods, nodes)),
		frameworkruntime.WithClientSet(client), frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithEventRecorder(recorder), frameworkruntime.WithPodActivator(activator),
		frameworkruntime.WithPodNominator(queue),
		frameworkruntime.WithWaitingPods(frameworkruntime.NewWaitingPodsMap()),
		frameworkruntime.WithPodsInPreBind(frameworkruntime.NewPodsInPreBindMap()))
	if err != nil {
		t.Fatal(err)
	}
	var obj runtime.Object
	if a != nil {
		obj = a
	}
	p, err := New(tCtx, obj, fh)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(tCtx.Done())
	factory.WaitForCacheSync(tCtx.Done())
	pl := p.(*Plugin)
	if !pl.waitForLedger(tCtx) {
		t.Fatal("ledger did not sync")
	}
	return &harness{ctx: tCtx, plugin: pl, client: client, recorder: recorder, activator: activator, queue: queue}
}

// nodeInfo is the scheduler's view of node as the harness's snapshot holds
// it: the node object given (which may be newer) and the pods bound to it.
func (h *harness) nodeInfo(node *v1.Node) fwk.NodeInfo {
	ni := framework.NewNodeInfo()
	if snapshot, err := h.plugin.handle.SnapshotSharedLister().NodeInfos().Get(node.Name); err == nil {
		for _, pi := range snapshot.GetPods() {
			ni.AddPodInfo(pi)
		}
	}
	ni.SetNode(node)
	return ni
}

// boundPod is a pod already running on node with the given cards.
func boundPod(name, node string, containers map[string][]gpuinfo.CardAssignment) *v1.Pod {
	a := gpuinfo.Assignment{Containers: containers}
	a.Version = a.NeededVersion()
	raw, err := a.Encode()
	if err != nil {
		panic(err)
	}
	p := st.MakePod().Name(name).Namespace("default").UID(name).Node(node).Annotation(gpuinfo.AssignmentAnnotation, raw)
	for c := range containers {
		p.Containers([]v1.Container{{Name: c}})
	}
	return p.Obj()
}

func gpuPod(name string, limits map[v1.ResourceName]string) *st.PodWrapper {
	return st.MakePod().Name(name).Namespace("default").UID(name).Lim(limits)
}

func TestPreFilter(t *testing.T) {
	h := newHarness(t, nil)
	tests := []struct {
		name     string
		pod      *v1.Pod
		wantCode fwk.Code
		wantMsg  string
	}{
		{"no GPU request skips", st.MakePod().Name("p").Lim(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj(), fwk.Skip, ""},
		{"valid request", gpuPod("p", testutil.Share(4096, 30)).Obj(), fwk.Success, ""},
		{"invalid request", gpuPod("p", map[v1.ResourceName]string{"tessera.io/gpu-cores": "150"}).Obj(), fwk.UnschedulableAndUnresolvable,
			`invalid GPU request: container "con0": resource tessera.io/gpu-cores: must be a whole percentage from 0 to 100, got 150`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := framework.NewCycleState()
			_, status := h.plugin.PreFilter(h.ctx, state, tc.pod, nil)
			if status.Code() != tc.wantCode || status.Message() != tc.wantMsg {
				t.Errorf("status = %v %q, want %v %q", status.Code(), status.Message(), tc.wantCode, tc.wantMsg)
			}
			if got := getState(state) != nil; got != (tc.wantCode == fwk.Success) {
				t.Errorf("state written = %v", got)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	a100 := testutil.GPUNode("a100", testutil.Inventory("a", "NVIDIA A100-SXM4-80GB", 81920, 2))
	t4 := testutil.GPUNode("t4", testutil.Inventory("t", "Tesla T4", 16384, 1))
	plain := st.MakeNode().Name("plain").Obj()
	broken := st.MakeNode().Name("broken").Annotation(gpuinfo.InventoryAnnotation, `{"version":1,"cards":[{"index":0}]}`).Obj()
	sick := testutil.Inventory("s", "Tesla T4", 16384, 1)
	sick.Cards[0].Healthy = false
	sickNode := testutil.GPUNode("sick", sick)
	// The T4 is mostly taken.
	running := boundPod("running", "t4", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-t-0", MemoryMiB: 10240, Cores: 80}}})
	h := newHarness(t, nil, a100, t4, plain, broken, sickNode, running)
	tests := []struct {
		name     string
		pod      *v1.Pod
		node     *v1.Node
		wantCode fwk.Code
		wantMsg  string
	}{
		{"fits", gpuPod("p", testutil.Share(4096, 30)).Obj(), a100, fwk.Success, ""},
		{"memory short", gpuPod("p", testutil.Share(8192, 10)).Obj(), t4, fwk.Unschedulable, "no GPU has 8192 MiB free"},
		{"compute short", gpuPod("p", testutil.Share(1024, 30)).Obj(), t4, fwk.Unschedulable, "no GPU has 30% compute free"},
		{"too few cards", gpuPod("p", testutil.Cards(4)).Obj(), a100, fwk.Unschedulable, "fewer than 4 GPUs have room"},
		{"model mismatch", gpuPod("p", testutil.Cards(1)).Annotation(gpuinfo.ModelAnnotation, "A100").Obj(), t4, fwk.UnschedulableAndUnresolvable, "no GPU matches model a100"},
		{"model excluded", gpuPod("p", testutil.Cards(1)).Annotation(gpuinfo.ModelExcludeAnnotation, "a100").Obj(), a100, fwk.UnschedulableAndUnresolvable, "no GPU matches model not a100"},
		{"uuid chosen", gpuPod("p", testutil.Cards(1)).Annotation(gpuinfo.UUIDAnnotation, "GPU-a-1").Obj(), a100, fwk.Success, ""},
		{"no inventory", gpuPod("p", testutil.Cards(1)).Obj(), plain, fwk.UnschedulableAndUnresolvable, reasonNoGPUs},
		{"invalid inventory", gpuPod("p", testutil.Cards(1)).Obj(), broken, fwk.UnschedulableAndUnresolvable, reasonInvalidInventory},
		{"unhealthy card", gpuPod("p", testutil.Share(1, 0)).Obj(), sickNode, fwk.UnschedulableAndUnresolvable, "no healthy GPU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := framework.NewCycleState()
			if _, s := h.plugin.PreFilter(h.ctx, state, tc.pod, nil); !s.IsSuccess() {
				t.Fatalf("PreFilter: %v", s)
			}
			status := h.plugin.Filter(h.ctx, state, tc.pod, h.nodeInfo(tc.node))
			if status.Code() != tc.wantCode || status.Message() != tc.wantMsg {
				t.Errorf("status = %v %q, want %v %q", status.Code(), status.Message(), tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestInvalidInventoryIsReported(t *testing.T) {
	broken := st.MakeNode().Name("broken").Annotation(gpuinfo.InventoryAnnotation, `{"version":1,"cards":[{"index":0,"uuid":"a","model":"T4","memoryMiB":-1,"cores":100}]}`).Obj()
	h := newHarness(t, nil, broken)
	select {
	case e := <-h.recorder.Events:
		for _, want := range []string{eventInvalidInventory, "cards[0].memoryMiB"} {
			if !strings.Contains(e, want) {
				t.Errorf("event %q does not contain %q", e, want)
			}
		}
	default:
		t.Fatal("no event for an invalid inventory")
	}
}

func TestScore(t *testing.T) {
	used := testutil.GPUNode("used", testutil.Inventory("u", "A100", 81920, 2))
	empty := testutil.GPUNode("empty", testutil.Inventory("e", "A100", 81920, 2))
	running := boundPod("running", "used", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-u-0", MemoryMiB: 40960, Cores: 50}}})
	pod := gpuPod("p", testutil.Share(8192, 10)).Obj()
	// After placement "used" is 30% used (49152 of 163840 MiB, 60 of 200
	// cores) and "empty" 5%; normalized: 100 and 5*100/30.
	for _, tc := range []struct {
		policy config.Policy
		want   fwk.NodeScoreList
	}{
		{config.PolicyBinpack, fwk.NodeScoreList{{Name: "used", Score: 100}, {Name: "empty", Score: 16}}},
		{config.PolicySpread, fwk.NodeScoreList{{Name: "used", Score: 0}, {Name: "empty", Score: 84}}},
	} {
		// After Filter, Score takes Filter's placement; alone, it places
		// the pod itself. Both must give the figures above.
		for _, filterFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/after Filter %v", tc.policy, filterFirst), func(t *testing.T) {
				h := newHarness(t, args(tc.policy, tc.policy), used, empty, running)
				got := scoreNodesAfter(t, h, pod, filterFirst, h.nodeInfo(used), h.nodeInfo(empty))
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("scores (-want,+got):\n%s", diff)
				}
			})
		}
	}
}

// TestScorePrefersLinkedCards: under every policy a pod of four whole cards
// prefers the node where it gets four cards on NVLink to the one where it
// would not (the fuller one, which Binpack prefers otherwise, and the
// emptier one, Spread's otherwise).
func TestScorePrefersLinkedCards(t *testing.T) {
	quads := func(name string) *v1.Node {
		inv := testutil.Inventory(name, "H100", 81920, 8)
		topology.Apply(inv, topology.NVLinkQuads)
		return testutil.GPUNode(name, inv)
	}
	broken, linked, idle := quads("broken"), quads("linked"), quads("idle")
	holders := []runtime.Object{
		// "broken" holds a card in each quad and a quarter of another,
		// "linked" two cards in one quad, "idle" a quarter of one card.
		boundPod("b0", "broken", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-broken-0", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("b4", "broken", map[string][]gpuinfo.CardAssignment{"c": {{Index: 4, UUID: "GPU-broken-4", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("b1", "broken", map[string][]gpuinfo.CardAssignment{"c": {{Index: 1, UUID: "GPU-broken-1", MemoryMiB: 20480, Cores: 25}}}),
		boundPod("l0", "linked", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-linked-0", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("l1", "linked", map[string][]gpuinfo.CardAssignment{"c": {{Index: 1, UUID: "GPU-linked-1", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("i0", "idle", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-idle-0", MemoryMiB: 20480, Cores: 25}}}),
	}
	four := gpuPod("four", testutil.Cards(4)).Obj()
	for _, policy := range []config.Policy{config.PolicyBinpack, config.PolicySpread, config.PolicyFragmentationAware} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t, args(policy, policy), append([]runtime.Object{broken, linked, idle}, holders...)...)
			got := map[string]int64{}
			for _, s := range scoreNodes(t, h, four, h.nodeInfo(broken), h.nodeInfo(linked), h.nodeInfo(idle)) {
				got[s.Name] = s.Score
			}
			if got["broken"] >= got["linked"] || got["broken"] >= got["idle"] {
				t.Errorf("scores %v; want the node without a free NVLink quad below both others", got)
			}
			// Between two nodes offering a quad, the policy decides.
			if fuller := got["linked"] > got["idle"]; fuller != (policy != config.PolicySpread) {
				t.Errorf("scores %v; want the policy's choice between the nodes with a free quad", got)
			}
		})
	}
}

// TestScoreKeepsNVLinkForMultiCardPods: under Binpack and
// FragmentationAware a one-card pod goes where it breaks no NVLink group (a
// PCIe node), rather than to the fuller NVSwitch node.
func TestScoreKeepsNVLinkForMultiCardPods(t *testing.T) {
	shaped := func(name, shape string, n int) *v1.Node {
		inv := testutil.Inventory(name, "H100", 81920, n)
		topology.Apply(inv, shape)
		return testutil.GPUNode(name, inv)
	}
	nvswitch, pcie := shaped("nvswitch", topology.NVSwitch, 8), shaped("pcie", topology.PCIeSockets, 4)
	objects := []runtime.Object{nvswitch, pcie,
		boundPod("p0", "pcie", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-pcie-0", MemoryMiB: 81920, Cores: 100}}})}
	for i := range 4 {
		objects = append(objects, boundPod(fmt.Sprint("n", i), "nvswitch", map[string][]gpuinfo.CardAssignment{"c": {{Index: i, UUID: fmt.Sprint("GPU-nvswitch-", i), MemoryMiB: 81920, Cores: 100}}}))
	}
	one := gpuPod("one", testutil.Cards(1)).Obj()
	for _, policy := range []config.Policy{config.PolicyBinpack, config.PolicyFragmentationAware} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t, args(policy, policy), objects...)
			got := map[string]int64{}
			for _, s := range scoreNodes(t, h, one, h.nodeInfo(nvswitch), h.nodeInfo(pcie)) {
				got[s.Name] = s.Score
			}
			if got["pcie"] <= got["nvswitch"] {
				t.Errorf("scores %v; want the PCIe node above the NVSwitch node", got)
			}
		})
	}
}

// TestPodsWithoutGPUsStrandTheLeastGPU: under every node policy a pod that
// asks for no GPUs prefers a node without GPUs, then the node whose cards
// are fullest, where its CPU can strand the least GPU.
func TestPodsWithoutGPUsStrandTheLeastGPU(t *testing.T) {
	cpuOnly := st.MakeNode().Name("cpu-only").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourcePods: "110"}).Obj()
	full := testutil.GPUNode("full", testutil.Inventory("f", "A100", 81920, 1))
	half := testutil.GPUNode("half", testutil.Inventory("h", "A100", 81920, 2))
	empty := testutil.GPUNode("empty", testutil.Inventory("e", "A100", 81920, 2))
	holders := []runtime.Object{
		boundPod("fills", "full", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-f-0", MemoryMiB: 81920, Cores: 100}}}),
		boundPod("halves", "half", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-h-0", MemoryMiB: 81920, Cores: 100}}}),
	}
	pod := st.MakePod().Name("web").Namespace("default").UID("web").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	for _, policy := range []config.Policy{config.PolicyBinpack, config.PolicySpread, config.PolicyFragmentationAware} {
		t.Run(string(policy), func(t *testing.T) {
			h := newHarness(t, args(policy, config.PolicyBinpack), append([]runtime.Object{cpuOnly, full, half, empty}, holders...)...)
			scores := scoreNodes(t, h, pod, h.nodeInfo(cpuOnly), h.nodeInfo(full), h.nodeInfo(half), h.nodeInfo(empty))
			got := map[string]int64{}
			for _, s := range scores {
				got[s.Name] = s.Score
			}
			if !(got["cpu-only"] >= got["full"] && got["full"] > got["half"] && got["half"] > got["empty"]) {
				t.Errorf("scores %v; want cpu-only >= full > half > empty", got)
			}
			if got["cpu-only"] != fwk.MaxNodeScore {
				t.Errorf("the node without GPUs scored %d, want %d", got["cpu-only"], fwk.MaxNodeScore)
			}
		})
	}
}

func TestReserveUnreserve(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 2))
	h := newHarness(t, args(config.PolicyBinpack, config.PolicyBinpack), node)
	before := h.plugin.ledger.Snapshot()
	first, second := gpuPod("first", testutil.Share(40960, 50)).Obj(), gpuPod("second", testutil.Share(40960, 50)).Obj()
	reserve := func(pod *v1.Pod) fwk.CycleState {
		state := framework.NewCycleState()
		h.plugin.PreFilter(h.ctx, state, pod, nil)
		if s := h.plugin.Reserve(h.ctx, state, pod, "n"); !s.IsSuccess() {
			t.Fatalf("Reserve %s: %v", pod.Name, s)
		}
		return state
	}
	s1 := reserve(first)
	s2 := reserve(second)
	cards := func(s fwk.CycleState, c string) []gpuinfo.CardAssignment { return getState(s).assignment.Containers[c] }
	if diff := cmp.Diff([]gpuinfo.CardAssignment{{Index: 0, UUID: "GPU-n-0", MemoryMiB: 40960, Cores: 50}}, cards(s1, "con0")); diff != "" {
		t.Errorf("first pod's cards (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]gpuinfo.CardAssignment{{Index: 0, UUID: "GPU-n-0", MemoryMiB: 40960, Cores: 50}}, cards(s2, "con0")); diff != "" {
		t.Errorf("binpack should put the second pod on the same card (-want,+got):\n%s", diff)
	}
	third := gpuPod("third", testutil.Cards(2)).Obj()
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, third, nil)
	if s := h.plugin.Filter(h.ctx, state, third, h.nodeInfo(node)); s.IsSuccess() {
		t.Error("two whole cards fit while one is reserved")
	}
	h.plugin.Unreserve(h.ctx, s1, first, "n")
	h.plugin.Unreserve(h.ctx, s2, second, "n")
	if diff := cmp.Diff(before, h.plugin.ledger.Snapshot()); diff != "" {
		t.Errorf("Unreserve did not roll back exactly (-before,+after):\n%s", diff)
	}
}

func TestBind(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	pod := gpuPod("p", testutil.Share(1024, 10)).Obj()
	plainPod := st.MakePod().Name("plain").Namespace("default").Obj()
	h := newHarness(t, nil, node, pod)
	var bindings []*v1.Binding
	h.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		bindings = append(bindings, action.(clienttesting.CreateAction).GetObject().(*v1.Binding))
		return true, nil, nil
	})
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pod, nil)
	if s := h.plugin.Reserve(h.ctx, state, pod, "n"); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Bind(h.ctx, state, pod, "n"); !s.IsSuccess() {
		t.Fatalf("Bind = %v", s)
	}
	if len(bindings) != 1 {
		t.Fatalf("got %d bindings, want 1", len(bindings))
	}
	b := bindings[0]
	got, err := gpuinfo.DecodeAssignment(b.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		t.Fatalf("binding's assignment: %v", err)
	}
	if diff := cmp.Diff(getState(state).assignment, got); diff != "" {
		t.Errorf("bound assignment (-reserved,+bound):\n%s", diff)
	}
	if b.Target.Name != "n" || b.UID != pod.UID {
		t.Errorf("binding targets %q with UID %q", b.Target.Name, b.UID)
	}
	// A pod without GPUs is left to DefaultBinder.
	if s := h.plugin.Bind(h.ctx, framework.NewCycleState(), plainPod, "n"); s.Code() != fwk.Skip {
		t.Errorf("Bind of a pod without GPUs = %v, want Skip", s)
	}
	// A GPU pod whose reservation was undone is not bound at all (skipping
	// it would let DefaultBinder bind it without an assignment).
	h.plugin.Unreserve(h.ctx, state, pod, "n")
	if s := h.plugin.Bind(h.ctx, state, pod, "n"); s.Code() != fwk.Error || len(bindings) != 1 {
		t.Errorf("Bind after Unreserve = %v, with %d bindings; want an error and no new binding", s, len(bindings))
	}
}

func TestBindRejectsCardThatTurnedUnhealthy(t *testing.T) {
	inv := testutil.Inventory("n", "A100", 81920, 1)
	node := testutil.GPUNode("n", inv)
	h := newHarness(t, nil, node)
	bound := false
	h.client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		bound = bound || action.GetSubresource() == "binding"
		return false, nil, nil
	})
	pod := gpuPod("p", testutil.Share(1024, 10)).Obj()
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pod, nil)
	if s := h.plugin.Reserve(h.ctx, state, pod, "n"); !s.IsSuccess() {
		t.Fatal(s)
	}
	inv.Cards[0].Healthy = false
	h.plugin.ledger.SetNode(testutil.GPUNode("n", inv))
	s := h.plugin.Bind(h.ctx, state, pod, "n")
	if !s.IsRejected() || !strings.Contains(s.Message(), "became unhealthy") {
		t.Errorf("Bind = %v, want a rejection naming the unhealthy card", s)
	}
	if bound {
		t.Error("the pod was bound to a node whose card turned unhealthy")
	}
}

func TestAddRemovePod(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	victim := boundPod("victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}})
	h := newHarness(t, nil, node, victim)
	pod := gpuPod("p", testutil.Share(40960, 50)).Obj()
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pod, nil)
	ni := h.nodeInfo(node)
	if s := h.plugin.Filter(h.ctx, state, pod, ni); s.IsSuccess() {
		t.Fatal("pod fits a card held whole by another pod")
	}
	victimInfo, _ := framework.NewPodInfo(victim)
	dryRun := state.Clone()
	if s := h.plugin.RemovePod(h.ctx, dryRun, pod, victimInfo, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, dryRun, pod, ni); !s.IsSuccess() {
		t.Errorf("pod does not fit after its victim was removed: %v", s)
	}
	if s := h.plugin.Filter(h.ctx, state, pod, ni); s.IsSuccess() {
		t.Error("removing the victim in a clone changed the original state")
	}
	nominated, _ := framework.NewPodInfo(gpuPod("nominated", testutil.Share(61440, 10)).Obj())
	if s := h.plugin.AddPod(h.ctx, dryRun, pod, nominated, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, dryRun, pod, ni); s.IsSuccess() {
		t.Error("pod fits beside a nominated pod that leaves it no room")
	}
	// The dry run reprieving the victim adds its charge back.
	reprieve := state.Clone()
	if s := h.plugin.RemovePod(h.ctx, reprieve, pod, victimInfo, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.AddPod(h.ctx, reprieve, pod, victimInfo, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, reprieve, pod, ni); s.IsSuccess() {
		t.Error("the pod fits after its victim was added back: AddPod charged nothing")
	}
}

func TestQueueingHints(t *testing.T) {
	h := newHarness(t, nil)
	pending := gpuPod("pending", testutil.Share(1024, 10)).Obj()
	holder := boundPod("holder", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "u", MemoryMiB: 1, Cores: 0}}})
	assumedGPU := gpuPod("assumed", testutil.Cards(1)).Node("n").Obj()
	cpuOnly := st.MakePod().Name("cpu").Node("n").Obj()
	inv := testutil.MustEncode(testutil.Inventory("n", "A100", 81920, 1))
	bigger := testutil.MustEncode(testutil.Inventory("n", "A100", 81920, 2))
	withInv := func(raw string) *v1.Node {
		return st.MakeNode().Name("n").Annotation(gpuinfo.InventoryAnnotation, raw).Obj()
	}
	plainNode := st.MakeNode().Name("n").Obj()
	advertising := func(cards string) *v1.Node {
		n := withInv(inv)
		n.Status.Allocatable = v1.ResourceList{"tessera.io/gpu": resource.MustParse(cards)}
		return n
	}
	tests := []struct {
		name     string
		fn       fwk.QueueingHintFn
		old, new any
		want     fwk.QueueingHint
	}{
		{"deleted pod held GPUs", h.plugin.isSchedulableAfterPodDeleted, holder, nil, fwk.Queue},
		{"un-assumed GPU pod", h.plugin.isSchedulableAfterPodDeleted, assumedGPU, nil, fwk.Queue},
		{"deleted pod had no GPUs", h.plugin.isSchedulableAfterPodDeleted, cpuOnly, nil, fwk.QueueSkip},
		{"node added with inventory", h.plugin.isSchedulableAfterNodeChange, nil, withInv(inv), fwk.Queue},
		{"node added without inventory", h.plugin.isSchedulableAfterNodeChange, nil, plainNode, fwk.QueueSkip},
		{"inventory grew", h.plugin.isSchedulableAfterNodeChange, withInv(inv), withInv(bigger), fwk.Queue},
		{"inventory unchanged", h.plugin.isSchedulableAfterNodeChange, withInv(inv), withInv(inv), fwk.QueueSkip},
		{"inventory removed", h.plugin.isSchedulableAfterNodeChange, withInv(inv), plainNode, fwk.QueueSkip},
		{"more cards advertised", h.plugin.isSchedulableAfterNodeChange, advertising("4"), advertising("8"), fwk.Queue},
		{"fewer cards advertised", h.plugin.isSchedulableAfterNodeChange, advertising("8"), advertising("4"), fwk.QueueSkip},
		{"cards advertised without inventory", h.plugin.isSchedulableAfterNodeChange, plainNode, func() *v1.Node {
			n := plainNode.DeepCopy()
			n.Status.Allocatable = v1.ResourceList{"tessera.io/gpu": resource.MustParse("8")}
			return n
		}(), fwk.QueueSkip},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn(ktesting.Init(t).Logger(), pending, tc.old, tc.new)
			if err != nil || got != tc.want {
				t.Errorf("hint = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	events, err := h.plugin.EventsToRegister(h.ctx)
	if err != nil || len(events) != 3 {
		t.Errorf("EventsToRegister = %v, %v", events, err)
	}
}

// TestPodDeletionHintChecksTheNode checks that a GPU pod's departure queues
// a pending pod only where the freed cards may hold it: on a node the ledger
// knows, the hint is Filter's verdict on that node, counted independently
// here from the cards each case leaves.
func TestPodDeletionHintChecksTheNode(t *testing.T) {
	card := func(node string, cores int64, mib int64) map[string][]gpuinfo.CardAssignment {
		return map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-" + node + "-0", MemoryMiB: mib, Cores: cores}}}
	}
	node := func(name string) *v1.Node {
		return st.MakeNode().Name(name).Annotation(gpuinfo.InventoryAnnotation, testutil.MustEncode(testutil.Inventory(name, "A100", 81920, 1))).Obj()
	}
	// "single" has one card held whole by "whole"; on "shared" the card is
	// held whole by "big" and barely by "small", so deleting "small" frees
	// almost nothing.
	whole := boundPod("whole", "single", card("single", 100, 81920))
	big := boundPod("big", "shared", card("shared", 100, 81920))
	small := boundPod("small", "shared", card("shared", 0, 1))
	elsewhere := boundPod("elsewhere", "unknown", card("unknown", 100, 81920))
	share := gpuPod("share", testutil.Share(10240, 10)).Obj()
	twoCards := gpuPod("two-cards", testutil.Cards(2)).Obj()
	h100Only := gpuPod("h100-only", testutil.Share(10240, 10)).Annotation(gpuinfo.ModelAnnotation, "H100").Obj()
	tests := []struct {
		name    string
		pending *v1.Pod
		deleted *v1.Pod
		want    fwk.QueueingHint
	}{
		{"the freed card holds the share", share, whole, fwk.Queue},
		{"a one-card node cannot hold two cards", twoCards, whole, fwk.QueueSkip},
		{"no card of the pod's model there", h100Only, whole, fwk.QueueSkip},
		{"the card stays full after a small pod leaves", share, small, fwk.QueueSkip},
		{"a node the ledger does not know", share, elsewhere, fwk.Queue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, node("single"), node("shared"), whole, big, small)
			got, err := h.plugin.isSchedulableAfterPodDeleted(ktesting.Init(t).Logger(), tc.pending, tc.deleted, nil)
			if err != nil || got != tc.want {
				t.Errorf("hint = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestShareChangeHint: a resize that shrinks a placed pod's share queues a
// pending pod only when the card then holds it (counted here from the
// shares each case leaves on the 80 GiB card); an update that leaves the
// assignment alone never does.
func TestShareChangeHint(t *testing.T) {
	node := st.MakeNode().Name("n").Annotation(gpuinfo.InventoryAnnotation, testutil.MustEncode(testutil.Inventory("n", "A100", 81920, 1))).Obj()
	holding := func(mib, cores int64) *v1.Pod {
		return boundPod("holder", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: mib, Cores: cores}}})
	}
	full := holding(81920, 90)
	statusOnly := full.DeepCopy()
	statusOnly.Status.Phase = v1.PodRunning
	share := gpuPod("share", testutil.Share(10240, 10)).Obj()
	tests := []struct {
		name string
		new  *v1.Pod
		want fwk.QueueingHint
	}{
		{"shrunk to half the card", holding(40960, 50), fwk.Queue},
		{"shrunk, 5 GiB left for a 10 GiB share", holding(76800, 50), fwk.QueueSkip},
		{"status updated, share unchanged", statusOnly, fwk.QueueSkip},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, node, full)
			got, err := h.plugin.isSchedulableAfterShareChanged(ktesting.Init(t).Logger(), share, full, tc.new)
			if err != nil || got != tc.want {
				t.Errorf("hint = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestSignPod(t *testing.T) {
	h := newHarness(t, nil)
	a, _ := h.plugin.SignPod(h.ctx, gpuPod("a", testutil.Share(1024, 10)).Obj())
	b, _ := h.plugin.SignPod(h.ctx, gpuPod("b", testutil.Share(1024, 10)).Obj())
	c, _ := h.plugin.SignPod(h.ctx, gpuPod("c", testutil.Share(2048, 10)).Obj())
	if !cmp.Equal(a, b) {
		t.Error("identical requests signed differently")
	}
	if cmp.Equal(a, c) {
		t.Error("different requests signed alike")
	}
	if _, s := h.plugin.SignPod(h.ctx, gpuPod("bad", map[v1.ResourceName]string{"tessera.io/gpu": "0"}).Obj()); s.IsSuccess() {
		t.Error("an invalid request was signed")
	}
}

// TestSnapshotIsAuthoritative: a bound pod the NodeInfo being filtered does
// not hold is not counted — kube-scheduler's pod-group preemption removes its
// potential victims from the snapshot without calling RemovePod — and a pod
// RemovePod took out is not taken out a second time for being absent too.
func TestSnapshotIsAuthoritative(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	half := func(name string) *v1.Pod {
		return boundPod(name, "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 40960, Cores: 50}}})
	}
	a, b := half("a"), half("b")
	h := newHarness(t, nil, node, a, b)
	without := func(names ...string) fwk.NodeInfo {
		ni := framework.NewNodeInfo()
		for _, p := range []*v1.Pod{a, b} {
			if !slices.Contains(names, p.Name) {
				ni.AddPod(p)
			}
		}
		ni.SetNode(node)
		return ni
	}
	whole := gpuPod("whole", testutil.Share(81920, 100)).Obj()
	tests := []struct {
		name    string
		removed []string // by RemovePod, from the NodeInfo too
		absent  []string // from the NodeInfo only
		want    bool
	}{
		{name: "both pods there", want: false},
		{name: "both absent from the snapshot", absent: []string{"a", "b"}, want: true},
		{name: "one removed by RemovePod", removed: []string{"a"}, want: false},
		{name: "both removed by RemovePod", removed: []string{"a", "b"}, want: true},
		{name: "one removed, one absent", removed: []string{"a"}, absent: []string{"b"}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state := framework.NewCycleState()
			h.plugin.PreFilter(h.ctx, state, whole, nil)
			ni := without(append(slices.Clone(tc.removed), tc.absent...)...)
			for _, name := range tc.removed {
				victim, _ := framework.NewPodInfo(map[string]*v1.Pod{"a": a, "b": b}[name])
				// The evaluator may remove a pod from several clones; each
				// removal counts once.
				for range 2 {
					if s := h.plugin.RemovePod(h.ctx, state, whole, victim, ni); !s.IsSuccess() {
						t.Fatal(s)
					}
				}
			}
			if got := h.plugin.Filter(h.ctx, state, whole, ni).IsSuccess(); got != tc.want {
				t.Errorf("a whole card fits: %t, want %t", got, tc.want)
			}
		})
	}
}

// TestStaleLedgerBesideNominatedPods: the ledger still holds a pod the API
// has deleted (its handler lags the snapshot) and another pod is nominated
// to the node. The node is judged without the deleted pod all the same;
// before, a nominated pod's deltas skipped that check, and a preemptor whose
// victim was already gone could be refused its node and bound elsewhere —
// the randomized preemption test's flake.
func TestStaleLedgerBesideNominatedPods(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	h := newHarness(t, nil, node)
	gone := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 40960, Cores: 50}}}}
	h.plugin.ledger.AddPod("victim-deleted", "n", []gpuinfo.NamedContainer{{Name: "c"}}, gone, false)
	preemptor := gpuPod("preemptor", testutil.Share(40960, 50)).Obj()
	nominated, _ := framework.NewPodInfo(gpuPod("nominated", testutil.Share(20480, 20)).Obj())
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, preemptor, nil)
	ni := h.nodeInfo(node)
	if s := h.plugin.AddPod(h.ctx, state, preemptor, nominated, ni); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, state, preemptor, ni); !s.IsSuccess() {
		t.Errorf("Filter counted a deleted pod beside a nominated one: %v", s)
	}
}

// TestFilterCatchesUpWithSnapshot covers the moment when the scheduler's
// snapshot is ahead of the ledger's informer handler.
func TestFilterCatchesUpWithSnapshot(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	h := newHarness(t, nil, node)
	pod := gpuPod("p", testutil.Cards(1)).Obj()

	// A pod the API has already deleted still holds the card in the ledger.
	gone := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}}}
	h.plugin.ledger.AddPod("deleted-already", "n", []gpuinfo.NamedContainer{{Name: "c"}}, gone, false)
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pod, nil)
	if s := h.plugin.Filter(h.ctx, state, pod, h.nodeInfo(node)); !s.IsSuccess() {
		t.Errorf("Filter did not drop a pod missing from the API: %v", s)
	}
	if h.plugin.ledger.Holds("deleted-already") {
		t.Error("the deleted pod is still in the ledger")
	}

	// The snapshot shows a second card the ledger has not recorded yet.
	two := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 2))
	pair := gpuPod("pair", testutil.Cards(2)).Obj()
	state = framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pair, nil)
	if s := h.plugin.Filter(h.ctx, state, pair, h.nodeInfo(two)); !s.IsSuccess() {
		t.Errorf("Filter ignored the snapshot's newer inventory: %v", s)
	}
}

func agentLease(node string, renewed time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: gpuinfo.AgentLeasePrefix + node, Namespace: "tessera-system"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &t},
	}
}

func TestSilentAgentKeepsPodsOff(t *testing.T) {
	silent := testutil.GPUNode("silent", testutil.Inventory("s", "A100", 81920, 1))
	alive := testutil.GPUNode("alive", testutil.Inventory("a", "A100", 81920, 1))
	noLease := testutil.GPUNode("no-lease", testutil.Inventory("n", "A100", 81920, 1))
	noGPUs := st.MakeNode().Name("no-gpus").Obj()
	h := harnessOf(t, nil, false, silent, alive, noLease, noGPUs,
		agentLease("silent", time.Now().Add(-10*time.Minute)), agentLease("alive", time.Now()))
	pod := gpuPod("p", testutil.Share(1024, 10)).Obj()
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, pod, nil)
	// A silent agent, and an inventory without a Lease: no agent reports.
	for _, n := range []*v1.Node{silent, noLease} {
		s := h.plugin.Filter(h.ctx, state, pod, h.nodeInfo(n))
		if s.Code() != fwk.UnschedulableAndUnresolvable || s.Message() != reasonAgentSilent {
			t.Errorf("Filter on %s = %v %q, want its agent not reporting", n.Name, s.Code(), s.Message())
		}
	}
	if s := h.plugin.Filter(h.ctx, state, pod, h.nodeInfo(alive)); !s.IsSuccess() {
		t.Errorf("Filter on %s = %v", alive.Name, s)
	}
	// A node without GPUs needs no agent: it is refused for having none.
	if s := h.plugin.Filter(h.ctx, state, pod, h.nodeInfo(noGPUs)); s.Message() != reasonNoGPUs {
		t.Errorf("Filter on a node without GPUs = %v", s)
	}
	// The agent reports again: the pod is retried at once.
	if _, err := h.client.CoordinationV1().Leases("tessera-system").Update(h.ctx, agentLease("silent", time.Now()), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(h.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(h.activator.get()) > 0, nil
	}); err != nil {
		t.Fatalf("the waiting pod was not activated when the agent reported: %v", err)
	}
	if diff := cmp.Diff([]string{"default/p"}, h.activator.get()); diff != "" {
		t.Errorf("activated pods (-want,+got):\n%s", diff)
	}
	if s := h.plugin.Filter(h.ctx, state, pod, h.nodeInfo(silent)); !s.IsSuccess() {
		t.Errorf("Filter after the agent reported = %v", s)
	}

	// With the check disabled, a silent agent does not matter.
	a := args(config.PolicyBinpack, config.PolicyBinpack)
	a.AgentHeartbeatTimeout = metav1.Duration{}
	off := newHarness(t, a, silent, agentLease("silent", time.Now().Add(-time.Hour)))
	state = framework.NewCycleState()
	off.plugin.PreFilter(off.ctx, state, pod, nil)
	if s := off.plugin.Filter(off.ctx, state, pod, off.nodeInfo(silent)); !s.IsSuccess() {
		t.Errorf("Filter with the check disabled = %v", s)
	}
}

// TestHeartbeatsOnTheSchedulersClock: renewals are timed when the scheduler
// sees them, so an agent whose clock runs behind still counts as
// reporting while it renews, one whose clock runs ahead is not trusted
// beyond now, and a Lease seen again unrenewed does not count as a renewal.
func TestHeartbeatsOnTheSchedulersClock(t *testing.T) {
	h := harnessOf(t, nil, false)
	rec := func() int64 { return h.plugin.records.get("n").renewed.Load() }
	before := time.Now().UnixNano()
	h.plugin.onLease(agentLease("n", time.Now().Add(time.Hour))) // first seen, an hour ahead
	if got := rec(); got < before || got > time.Now().UnixNano() {
		t.Errorf("a Lease renewed in the future counts from %v, want now", time.Unix(0, got))
	}
	behind := time.Now().Add(-time.Hour)
	h.plugin.onLease(agentLease("n", behind)) // renewed, by a clock an hour behind
	first := rec()
	if first < before {
		t.Errorf("a renewal by a clock running behind counts from %v, want now", time.Unix(0, first))
	}
	h.plugin.onLease(agentLease("n", behind)) // the same renewal seen again
	if rec() != first {
		t.Error("a Lease seen again without a renewal counted as one")
	}
	stale := harnessOf(t, nil, false)
	stale.plugin.onLease(agentLease("n", time.Now().Add(-time.Hour))) // first seen, an hour old
	if got := stale.plugin.records.get("n").renewed.Load(); got > time.Now().Add(-59*time.Minute).UnixNano() {
		t.Errorf("a Lease last renewed an hour ago, first seen now, counts from %v", time.Unix(0, got))
	}
}

// TestVictimGoneRetriesItsPreemptor: when a pod the scheduler evicted by
// preemption is gone, the pods nominated to its node are moved back to the
// active queue (the queue also remembers it for a pod whose cycle is still
// in flight, where the deletion event alone could be lost); a pod its owner
// deleted moves no one.
func TestVictimGoneRetriesItsPreemptor(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	pending := gpuPod("preemptor", testutil.Cards(1)).Obj()
	h := newHarness(t, nil, node, pending) // the nominator nominates only pods the API has
	preemptor, _ := framework.NewPodInfo(pending)
	h.plugin.handle.AddNominatedPod(klog.Background(), preemptor, &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride, NominatedNodeName: "n"})
	gone := func(name string, preempted bool) *v1.Pod {
		p := boundPod(name, "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}})
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		if preempted {
			p.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}}
		}
		return p
	}
	h.plugin.onPodGone(gone("owner-deleted", false))
	if got := h.activator.get(); len(got) != 0 {
		t.Errorf("a pod its owner deleted activated %v", got)
	}
	h.plugin.onPodGone(cache.DeletedFinalStateUnknown{Key: "default/victim", Obj: gone("victim", true)})
	if diff := cmp.Diff([]string{"default/preemptor"}, h.activator.get()); diff != "" {
		t.Errorf("activated (-want,+got):\n%s", diff)
	}
}

// TestNominationReadsVictimsFromTheStore: right after a preemption the
// cycle's snapshot may not show the victim terminating yet, while the
// informer's store does. The nomination holds the card the victim frees all
// the same: a peer of the preemptor's priority does not fit there.
func TestNominationReadsVictimsFromTheStore(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	victim := boundPod("victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 61440, Cores: 50}}})
	h := newHarness(t, nil, node, victim)
	snapshot := h.nodeInfo(node) // the victim running, as the next cycle may see it
	evicted := victim.DeepCopy()
	evicted.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(30 * time.Second)}
	evicted.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler,
		LastTransitionTime: metav1.Now()}}
	if _, err := h.client.CoreV1().Pods(victim.Namespace).Update(h.ctx, evicted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(h.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		p := h.plugin.latest(victim)
		return p != nil && p.DeletionTimestamp != nil, nil
	}); err != nil {
		t.Fatalf("the informer's store did not see the eviction: %v", err)
	}
	preemptor, _ := framework.NewPodInfo(gpuPod("preemptor", testutil.Share(71680, 50)).Priority(1000).Obj())
	peer := gpuPod("peer", testutil.Share(15360, 10)).Priority(1000).Obj()
	state := framework.NewCycleState()
	h.plugin.PreFilter(h.ctx, state, peer, nil)
	if s := h.plugin.AddPod(h.ctx, state, peer, preemptor, snapshot); !s.IsSuccess() {
		t.Fatal(s)
	}
	if s := h.plugin.Filter(h.ctx, state, peer, snapshot); s.IsSuccess() {
		t.Error("the peer fits on the card the nominated preemptor evicted for")
	}
}

// TestNominatedAfterVictimsGoneIsRetried: a pod whose nomination is recorded
// after its victims are already gone is retried at once; one whose victim
// is still terminating waits for that victim's deletion.
func TestNominatedAfterVictimsGoneIsRetried(t *testing.T) {
	node := testutil.GPUNode("n", testutil.Inventory("n", "A100", 81920, 1))
	victim := boundPod("victim", "n", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-n-0", MemoryMiB: 81920, Cores: 100}}})
	victim.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(30 * time.Second)}
	victim.Status.Conditions = []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    []string
	}{
		{name: "victims gone", objects: []runtime.Object{node}, want: []string{"default/preemptor"}},
		{name: "a victim still terminating", objects: []runtime.Object{node, victim}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, tc.objects...)
			pending := gpuPod("preemptor", testutil.Cards(1)).Priority(1000).Obj()
			nominated := pending.DeepCopy()
			nominated.Status.NominatedNodeName = "n"
			h.plugin.onNomination(pending, nominated)
			h.plugin.onNomination(nominated, nominated) // unchanged: nothing to do
			if diff := cmp.Diff(tc.want, h.activator.get()); diff != "" {
				t.Errorf("activated (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestHoldUntil: a victim holds its preemptor until its deletion deadline,
// and no longer than maxVictimWait after it was marked — a tenant's pod whose
// preStop sleeps for a day delays the preemptor by five minutes at most.
func TestHoldUntil(t *testing.T) {
	marked := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		grace time.Duration
		want  time.Time
	}{
		{"short grace", 30 * time.Second, marked.Add(30 * time.Second)},
		{"a day's grace", 24 * time.Hour, marked.Add(maxVictimWait)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim := &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: marked.Add(tc.grace)}},
				Status: v1.PodStatus{Conditions: []v1.PodCondition{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
					Reason: v1.PodReasonPreemptionByScheduler, LastTransitionTime: metav1.Time{Time: marked}}}},
			}
			if got := holdUntil(victim); !got.Equal(tc.want) {
				t.Errorf("held until %v, want %v", got, tc.want)
			}
		})
	}
}
