package kueue

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// kueueKind is one of Kueue's kinds.
type kueueKind struct {
	kind     string
	resource string
}

// Kueue's API (v1beta2) and the pod integration's names.
var (
	flavors       = kueueKind{"ResourceFlavor", "resourceflavors"}
	clusterQueues = kueueKind{"ClusterQueue", "clusterqueues"}
	localQueues   = kueueKind{"LocalQueue", "localqueues"}
)

const (
	queueNameLabel = "kueue.x-k8s.io/queue-name"
	admissionGate  = "kueue.x-k8s.io/admission"
	// flavorLabel is the node label the test's ResourceFlavors select on.
	flavorLabel = "tessera.io/test-flavor"
)

// startScheduler runs Tessera's scheduler, as its ServiceAccount, until the
// test ends.
func startScheduler(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig, config := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "scheduler.yaml")
	if err := controlPlane.WriteSchedulerKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WriteSchedulerConfig(controlPlane.SchedulerConfig, kubeconfig, config); err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(t.Context(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
}

// node adds a simulated node of L4 cards with labels, whose agent reports
// until the test ends.
func node(t *testing.T, name string, labels map[string]string, cards int) {
	t.Helper()
	a, err := controlPlane.AddSimulatedNode(t.Context(), name, cluster.L4, cards, labels)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = controlPlane.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// create creates a Kueue object as the cluster's administrator, deleted when
// the test ends.
func create(t *testing.T, k kueueKind, namespace string, obj map[string]any) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: k.resource}
	client := dynamic.NewForConfigOrDie(controlPlane.Config).Resource(gvr)
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(gvr.GroupVersion().String())
	u.SetKind(k.kind)
	var ri dynamic.ResourceInterface = client
	if namespace != "" {
		ri = client.Namespace(namespace)
	}
	created, err := ri.Create(t.Context(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s %s: %v", k.kind, u.GetName(), err)
	}
	t.Cleanup(func() { _ = ri.Delete(context.Background(), created.GetName(), metav1.DeleteOptions{}) })
}

// queuedPod is a pod of queue asking for one L4 share.
func queuedPod(ns, name, queue string, memoryMiB, cores int64) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{queueNameLabel: queue}},
		Spec: v1.PodSpec{
			SchedulerName: "tessera-binpack",
			Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				"tessera.io/gpu-memory": *resource.NewQuantity(memoryMiB, resource.DecimalSI),
				"tessera.io/gpu-cores":  *resource.NewQuantity(cores, resource.DecimalSI),
			}}}},
		},
	}
}

// multiCardPod is queuedPod on cards cards.
func multiCardPod(ns, name, queue string, cards, memoryMiB, cores int64) *v1.Pod {
	p := queuedPod(ns, name, queue, memoryMiB, cores)
	p.Spec.Containers[0].Resources.Limits["tessera.io/gpu"] = *resource.NewQuantity(cards, resource.DecimalSI)
	return p
}

// waitFor polls cond until it holds, or fails the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// gated reports whether the pod still carries Kueue's admission gate.
func gated(p *v1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == admissionGate {
			return true
		}
	}
	return false
}

// oneAdmitted waits until one of the two pods is placed while Kueue holds
// the other behind its gate, and returns them.
func oneAdmitted(t *testing.T, ns string, names ...string) (placed, waiting *v1.Pod) {
	t.Helper()
	pods := controlPlane.Client.CoreV1().Pods(ns)
	waitFor(t, time.Minute, "one pod admitted and placed, the other held", func() (bool, error) {
		placed, waiting = nil, nil
		for _, name := range names {
			p, err := pods.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			switch {
			case p.Spec.NodeName != "":
				placed = p
			case gated(p):
				waiting = p
			}
		}
		return placed != nil && waiting != nil, nil
	})
	return placed, waiting
}

// waitNoQuota waits until Kueue has found no quota for a Workload of ns
// that match picks (its QuotaReserved condition False): it was looked at
// and held, not merely not looked at yet.
func waitNoQuota(t *testing.T, ns, what string, match func(*unstructured.Unstructured) bool) {
	t.Helper()
	workloads := dynamic.NewForConfigOrDie(controlPlane.Config).Resource(schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}).Namespace(ns)
	waitFor(t, time.Minute, "Kueue to find no quota for "+what, func() (bool, error) {
		list, err := workloads.List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if !match(&list.Items[i]) {
				continue
			}
			conditions, _, _ := unstructured.NestedSlice(list.Items[i].Object, "status", "conditions")
			for _, c := range conditions {
				if c, ok := c.(map[string]any); ok && c["type"] == "QuotaReserved" && c["status"] == "False" {
					return true, nil
				}
			}
		}
		return false, nil
	})
}

// checkCardsHold is the oracle: on every card of the namespace's pods, the
// memory their assignments give is at most an L4's.
func checkCardsHold(t *testing.T, ns string) {
	t.Helper()
	pods, err := controlPlane.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	for _, p := range pods.Items {
		raw, ok := p.Annotations[gpuinfo.AssignmentAnnotation]
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(raw)
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		for _, cards := range a.Containers {
			for _, c := range cards {
				held[c.UUID] += c.MemoryMiB
			}
		}
	}
	for uuid, mib := range held {
		if mib > l4MiB {
			t.Errorf("card %s: the pods' assignments give %d MiB of %d", uuid, mib, l4MiB)
		}
	}
}

// l4MiB is the memory of a simulated L4 card.
const l4MiB = 23034

// TestQuotaThenCards: Kueue admits against a ClusterQueue's quota of
// Tessera's shares, Tessera places the admitted pods on the cards of the
// admitted flavor's nodes. The quota (16000 MiB, 100 % compute) takes one
// of two 10000 MiB pods; the other waits behind Kueue's gate — with room
// for it on the cards — until the first leaves. Both are placed on the
// flavor's node, never on a node of another flavor with free cards, and no
// card holds more than it has.
func TestQuotaThenCards(t *testing.T) {
	ns, flavor := teamOnL4(t, 1, 16000, 100)
	node(t, ns+"-b", map[string]string{flavorLabel: ns + "-other"}, 2)

	pods := controlPlane.Client.CoreV1().Pods(ns)
	for _, name := range []string{"first", "second"} {
		created, err := pods.Create(t.Context(), queuedPod(ns, name, "team", 10000, 30), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		if !gated(created) {
			t.Fatalf("pod %s was created without Kueue's admission gate: is Kueue's webhook called?", name)
		}
	}
	placed, waiting := oneAdmitted(t, ns, "first", "second")
	if placed.Spec.NodeName != ns+"-a" || placed.Spec.NodeSelector[flavorLabel] != flavor {
		t.Errorf("pod %s placed on %s with node selector %v; want node %s-a, of flavor %s", placed.Name, placed.Spec.NodeName, placed.Spec.NodeSelector, ns, flavor)
	}
	if _, ok := placed.Annotations[gpuinfo.AssignmentAnnotation]; !ok {
		t.Errorf("pod %s bound without Tessera's card assignment", placed.Name)
	}
	checkCardsHold(t, ns)

	// The first leaves: its quota goes to the second.
	if err := pods.Delete(t.Context(), placed.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, fmt.Sprintf("pod %s admitted and placed once %s left", waiting.Name, placed.Name), func() (bool, error) {
		p, err := pods.Get(t.Context(), waiting.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		waiting = p
		return p.Spec.NodeName != "", nil
	})
	if waiting.Spec.NodeName != ns+"-a" {
		t.Errorf("pod %s placed on %s; want %s-a, of flavor %s", waiting.Name, waiting.Spec.NodeName, ns, flavor)
	}
	checkCardsHold(t, ns)
}

// clusterQueue is a ClusterQueue of the test's namespace with a quota of
// L4 shares on flavor — memoryMiB in total (tessera.io/gpu-memory-total,
// which the policy tessera-gpu-memory-total gives every container asking
// memory per card), cards and compute — in cohort when it is set; spec
// adds fields (preemption).
func clusterQueue(t *testing.T, ns, name, flavor, cohort string, memoryMiB, cores int64, spec map[string]any) {
	t.Helper()
	s := map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}},
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{"tessera.io/gpu", "tessera.io/gpu-memory", "tessera.io/gpu-memory-total", "tessera.io/gpu-cores"},
			"flavors": []any{map[string]any{"name": flavor, "resources": []any{
				map[string]any{"name": "tessera.io/gpu", "nominalQuota": "64"},
				// Per card: the total is the quota.
				map[string]any{"name": "tessera.io/gpu-memory", "nominalQuota": "1048576"},
				map[string]any{"name": "tessera.io/gpu-memory-total", "nominalQuota": fmt.Sprint(memoryMiB)},
				map[string]any{"name": "tessera.io/gpu-cores", "nominalQuota": fmt.Sprint(cores)},
			}}},
		}},
	}
	if cohort != "" {
		s["cohortName"] = cohort
	}
	for k, v := range spec {
		s[k] = v
	}
	create(t, clusterQueues, "", map[string]any{"metadata": map[string]any{"name": name}, "spec": s})
}

// flavorOn creates a ResourceFlavor selecting the nodes labelled for it.
func flavorOn(t *testing.T, flavor string) {
	t.Helper()
	create(t, flavors, "", map[string]any{"metadata": map[string]any{"name": flavor},
		"spec": map[string]any{"nodeLabels": map[string]any{flavorLabel: flavor}}})
}

// teamOnL4 is a namespace Kueue manages with a LocalQueue "team" whose
// ClusterQueue has memoryMiB and cores of quota on a flavor of one node of
// cards L4 cards; Tessera's scheduler runs. It returns the namespace and
// the flavor (the node is <namespace>-a).
func teamOnL4(t *testing.T, cards int, memoryMiB, cores int64) (string, string) {
	t.Helper()
	ns := newNamespace(t)
	flavor := ns + "-l4"
	node(t, ns+"-a", map[string]string{flavorLabel: flavor}, cards)
	startScheduler(t)
	flavorOn(t, flavor)
	clusterQueue(t, ns, ns, flavor, "", memoryMiB, cores, nil)
	localQueue(t, ns, "team", ns)
	return ns, flavor
}

// localQueue creates a LocalQueue of the namespace pointing at a
// ClusterQueue.
func localQueue(t *testing.T, ns, name, clusterQueue string) {
	t.Helper()
	create(t, localQueues, ns, map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"clusterQueue": clusterQueue}})
}

// TestBorrowThenReclaim: two teams' ClusterQueues share a cohort, 10000 MiB
// of L4 shares each, on one L4 card (23034 MiB). Team A's second pod borrows
// team B's idle quota and Tessera places both of A's pods on the card; when
// team B asks for its own, Kueue reclaims it — evicting one of A's pods —
// and Tessera places B's pod in the room the eviction freed. The card never
// holds more than it has.
func TestBorrowThenReclaim(t *testing.T) {
	ns := newNamespace(t)
	flavor := ns + "-l4"
	node(t, ns+"-a", map[string]string{flavorLabel: flavor}, 1)
	startScheduler(t)
	_, kubeletDone := cluster.StartKubelet(t.Context(), controlPlane.Client, ns)
	t.Cleanup(func() { <-kubeletDone })
	flavorOn(t, flavor)
	cohort := ns + "-cohort"
	clusterQueue(t, ns, ns+"-a", flavor, cohort, 10000, 100, nil)
	clusterQueue(t, ns, ns+"-b", flavor, cohort, 10000, 100, map[string]any{
		"preemption": map[string]any{"reclaimWithinCohort": "Any"}})
	localQueue(t, ns, "team-a", ns+"-a")
	localQueue(t, ns, "team-b", ns+"-b")

	pods := controlPlane.Client.CoreV1().Pods(ns)
	bound := func(names ...string) func() (bool, error) {
		return func() (bool, error) {
			for _, name := range names {
				p, err := pods.Get(t.Context(), name, metav1.GetOptions{})
				if err != nil || p.Spec.NodeName == "" {
					return false, nil
				}
			}
			return true, nil
		}
	}
	for _, name := range []string{"a-1", "a-2"} {
		if _, err := pods.Create(t.Context(), queuedPod(ns, name, "team-a", 8000, 30), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// 16000 MiB for team A: 6000 borrowed from team B's quota.
	waitFor(t, time.Minute, "both of team A's pods admitted (one borrowing) and placed", bound("a-1", "a-2"))
	checkCardsHold(t, ns)

	if _, err := pods.Create(t.Context(), queuedPod(ns, "b-1", "team-b", 8000, 30), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "team B's pod admitted, reclaiming its quota, and placed", bound("b-1"))
	left := 0
	for _, name := range []string{"a-1", "a-2"} {
		if p, err := pods.Get(t.Context(), name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
			left++
		}
	}
	if left != 1 {
		t.Errorf("%d of team A's pods left running after the reclaim, want 1", left)
	}
	checkCardsHold(t, ns)
}

// TestPodGroupWhole: Kueue admits a pod group whole or not at all, and
// Tessera places every pod of an admitted group. A group of two 12000 MiB
// pods does not fit a 20000 MiB quota: neither is admitted, though one
// would fit. A group of two 8000 MiB pods fits: both are placed.
func TestPodGroupWhole(t *testing.T) {
	ns, _ := teamOnL4(t, 2, 20000, 200)
	pods := controlPlane.Client.CoreV1().Pods(ns)
	group := func(name string, memoryMiB int64) []string {
		var names []string
		for i := range 2 {
			p := queuedPod(ns, fmt.Sprintf("%s-%d", name, i), "team", memoryMiB, 30)
			p.Labels["kueue.x-k8s.io/pod-group-name"] = name
			p.Annotations = map[string]string{"kueue.x-k8s.io/pod-group-total-count": "2"}
			if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			names = append(names, p.Name)
		}
		return names
	}
	big := group("big", 12000)
	small := group("small", 8000)
	waitFor(t, time.Minute, "the small group placed whole", func() (bool, error) {
		for _, name := range small {
			p, err := pods.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				return false, err
			}
		}
		return true, nil
	})
	// Kueue has looked at the big group and found no quota for it (its
	// Workload is named after the group).
	waitNoQuota(t, ns, "the big group", func(w *unstructured.Unstructured) bool { return w.GetName() == "big" })
	for _, name := range big {
		p, err := pods.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" || !gated(p) {
			t.Errorf("pod %s of the group that does not fit its quota: node %q, gated %v; want it gated, unplaced", name, p.Spec.NodeName, gated(p))
		}
	}
	checkCardsHold(t, ns)
}

// TestOverlayQueues: the example queues of manifests/overlays/kueue install
// (Kueue's webhooks accept them) and work: a pod of team-a's LocalQueue is
// admitted on the L4 flavor and placed by Tessera on the node GPU Feature
// Discovery's label names as an L4.
func TestOverlayQueues(t *testing.T) {
	objs, err := install.Render("overlays/kueue")
	if err != nil {
		t.Fatal(err)
	}
	var queues []*unstructured.Unstructured
	for _, o := range objs {
		if o.GroupVersionKind().Group == "kueue.x-k8s.io" {
			queues = append(queues, o)
		}
	}
	if len(queues) == 0 {
		t.Fatal("the overlay has no Kueue objects")
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := controlPlane.Client.CoreV1().Namespaces().Create(t.Context(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{managedLabel: "true"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := install.Apply(t.Context(), controlPlane.Config, queues); err != nil {
		t.Fatalf("installing the overlay's queues: %v", err)
	}
	node(t, "overlay-l4", map[string]string{"nvidia.com/gpu.product": "NVIDIA-L4"}, 1)
	node(t, "overlay-unlabelled", nil, 1)
	startScheduler(t)
	pods := controlPlane.Client.CoreV1().Pods("team-a")
	if _, err := pods.Create(t.Context(), queuedPod("team-a", "inference", "gpu", 10000, 30), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var placed *v1.Pod
	waitFor(t, time.Minute, "team-a's pod admitted and placed", func() (bool, error) {
		p, err := pods.Get(t.Context(), "inference", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		placed = p
		return p.Spec.NodeName != "", nil
	})
	if placed.Spec.NodeName != "overlay-l4" || placed.Spec.NodeSelector["nvidia.com/gpu.product"] != "NVIDIA-L4" {
		t.Errorf("placed on %s with node selector %v; want overlay-l4, selected by the nvidia-l4 flavor", placed.Spec.NodeName, placed.Spec.NodeSelector)
	}
	checkCardsHold(t, "team-a")
}

// TestQuotaCountsTotal: Kueue counts a multi-card pod by the GPU memory it
// holds on all its cards (tessera.io/gpu-memory-total), not by the per-card
// figure of its spec. With 24000 MiB of quota, a 2-card pod of 10000 MiB a
// card (20000 in all) is admitted and placed on two cards; a second one
// waits, though its 10000 per card would fit the quota.
func TestQuotaCountsTotal(t *testing.T) {
	ns, _ := teamOnL4(t, 4, 24000, 400)
	pods := controlPlane.Client.CoreV1().Pods(ns)
	for _, name := range []string{"first", "second"} {
		if _, err := pods.Create(t.Context(), multiCardPod(ns, name, "team", 2, 10000, 30), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	placed, waiting := oneAdmitted(t, ns, "first", "second")
	a, err := gpuinfo.DecodeAssignment(placed.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	if cards := a.Containers["main"]; len(cards) != 2 || cards[0].Index == cards[1].Index {
		t.Errorf("the admitted pod holds %+v, want two cards", cards)
	}
	// Kueue found no quota for the second: held, not merely not yet looked at.
	waitNoQuota(t, ns, "pod "+waiting.Name, func(w *unstructured.Unstructured) bool {
		owners := w.GetOwnerReferences()
		return len(owners) > 0 && owners[0].Name == waiting.Name
	})
	checkCardsHold(t, ns)
}
