package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
)

// Priority classes the preemption tests use.
const (
	lowPriority  = "tessera-test-low"
	midPriority  = "tessera-test-mid"
	highPriority = "tessera-test-high"
	// neverPreempts is high priority that never preempts.
	neverPreempts = "tessera-test-high-never"
)

// priorityClasses creates the test priority classes once.
func (e *env) priorityClasses() {
	e.tCtx.Helper()
	for _, pc := range []schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: lowPriority}, Value: 100},
		{ObjectMeta: metav1.ObjectMeta{Name: midPriority}, Value: 500},
		{ObjectMeta: metav1.ObjectMeta{Name: highPriority}, Value: 1000},
		{ObjectMeta: metav1.ObjectMeta{Name: neverPreempts}, Value: 1000, PreemptionPolicy: ptr.To(v1.PreemptNever)},
	} {
		_, err := e.client.SchedulingV1().PriorityClasses().Create(e.tCtx, &pc, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			e.tCtx.Fatal(err)
		}
	}
}

// prioritized is podSpec with a priority class.
func (e *env) prioritized(name, class string, limits map[string]int64) *v1.Pod {
	p := e.podSpec(name, "tessera-binpack", limits)
	p.Spec.PriorityClassName = class
	return p
}

// kubelet confirms the deletions of the test's pods, as the nodes' kubelets
// would, and tells which pods it saw terminate.
type kubelet struct{ *cluster.Kubelet }

func (e *env) startKubelet() kubelet {
	ctx, cancel := context.WithCancel(e.tCtx)
	k, done := cluster.StartKubelet(ctx, e.client, e.ns)
	e.tCtx.Cleanup(func() { cancel(); <-done })
	return kubelet{k}
}

// evicted returns the names of the pods the kubelet saw terminate, sorted.
func (k kubelet) evicted() []string {
	names, _ := k.Terminated()
	for i, n := range names {
		names[i] = n[strings.Index(n, "/")+1:]
	}
	return names
}

// TestPreemptionFreesTheRightCard fills eight cards with low-priority shares;
// a high-priority pod that needs half a card evicts the fewest pods of one
// card, leaves the other cards' pods alone, and binds to the card it freed.
func TestPreemptionFreesTheRightCard(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	node := e.node("full", cluster.A100, 8, nil)
	e.startScheduler()
	k := e.startKubelet()
	var low []string
	for i := 0; i < 32; i++ { // four 20 GiB shares per 80 GiB card
		low = append(low, fmt.Sprint("low-", i))
		e.create(e.prioritized(low[i], lowPriority, map[string]int64{"tessera.io/gpu-memory": 20480, "tessera.io/gpu-cores": 10}))
	}
	placed := e.waitBound(60*time.Second, low...)
	e.create(e.prioritized("urgent", highPriority, map[string]int64{"tessera.io/gpu-memory": 40960, "tessera.io/gpu-cores": 20}))
	urgent := placementOf(t, e.waitBound(60*time.Second, "urgent")["urgent"])
	evicted := k.evicted()
	if len(evicted) != 2 {
		t.Fatalf("evicted %v, want the two shares of one card", evicted)
	}
	for _, name := range evicted {
		if p := placementOf(t, placed[name]); p.Node != node || p.Cards[0] != urgent.Cards[0] {
			t.Errorf("victim %s was on %+v, not on the card the preemptor got (%+v)", name, p, urgent)
		}
	}
	for _, name := range low {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Fatal(err)
		case p.DeletionTimestamp != nil || p.UID != types.UID(placed[name].UID):
			t.Errorf("pod %s was disturbed", name)
		}
	}
	e.checkNoOvercommit(t)
}

// TestMultiCardPreemptorFreesAsManyCardsAsItNeeds: eight whole-card pods;
// a preemptor asking for two cards evicts two of them, not three.
func TestMultiCardPreemptorFreesAsManyCardsAsItNeeds(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("full", cluster.A100, 8, nil)
	e.startScheduler()
	k := e.startKubelet()
	var low []string
	for i := 0; i < 8; i++ {
		low = append(low, fmt.Sprint("low-", i))
		e.create(e.prioritized(low[i], lowPriority, map[string]int64{"tessera.io/gpu": 1}))
	}
	e.waitBound(60*time.Second, low...)
	e.create(e.prioritized("pair", highPriority, map[string]int64{"tessera.io/gpu": 2}))
	e.waitBound(60*time.Second, "pair")
	if evicted := k.evicted(); len(evicted) != 2 {
		t.Errorf("evicted %v, want two whole-card pods", evicted)
	}
	e.checkNoOvercommit(t)
}

// TestNoPreemptionWhereItCannotHelp: a high-priority pod that no eviction
// can place — its model is on no node, or it is larger than any card, or it
// may not preempt, or its victims would have its own priority — evicts
// nothing and stays Pending with its reason.
func TestNoPreemptionWhereItCannotHelp(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("full", cluster.T4, 2, nil)
	e.startScheduler()
	k := e.startKubelet()
	for i := 0; i < 2; i++ {
		e.create(e.prioritized(fmt.Sprint("low-", i), lowPriority, map[string]int64{"tessera.io/gpu": 1}))
	}
	e.waitBound(60*time.Second, "low-0", "low-1")
	for i := 0; i < 2; i++ {
		e.create(e.prioritized(fmt.Sprint("peer-", i), highPriority, map[string]int64{"tessera.io/gpu": 1}))
	}
	// The two peers take the cards from the low pods (preemption works here).
	e.waitBound(60*time.Second, "peer-0", "peer-1")
	before := k.evicted()

	wrongModel := e.prioritized("wrong-model", highPriority, map[string]int64{"tessera.io/gpu": 1})
	wrongModel.Annotations = map[string]string{"tessera.io/gpu-model": "H100"}
	tooLarge := e.prioritized("too-large", highPriority, map[string]int64{"tessera.io/gpu-memory": 20480})
	never := e.prioritized("never", neverPreempts, map[string]int64{"tessera.io/gpu": 1})
	equal := e.prioritized("equal", highPriority, map[string]int64{"tessera.io/gpu": 1})
	for _, p := range []*v1.Pod{wrongModel, tooLarge, never, equal} {
		e.create(p)
	}
	for _, name := range []string{"wrong-model", "too-large", "never", "equal"} {
		e.waitUnschedulable(name)
	}
	// A pod the scheduler tried again after marking it would have preempted
	// by now; a last look after every pod was marked.
	if after := k.evicted(); len(after) != len(before) {
		t.Errorf("pods were evicted for preemptors that could not use their cards: %v (before: %v)", after, before)
	}
	for _, name := range []string{"wrong-model", "too-large", "never", "equal"} {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil || p.Status.NominatedNodeName != "" {
			t.Errorf("pod %s was nominated to %q (%v)", name, p.Status.NominatedNodeName, err)
		}
	}
}

// TestPreemptionAvoidsPDBProtectedPods: of two pods that could make room,
// the preemptor evicts the one no PodDisruptionBudget protects.
func TestPreemptionAvoidsPDBProtectedPods(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("full", cluster.A100, 2, nil)
	e.startScheduler()
	k := e.startKubelet()
	protected := e.prioritized("protected", lowPriority, map[string]int64{"tessera.io/gpu": 1})
	protected.Labels = map[string]string{"app": "db"}
	e.create(protected)
	e.waitBound(30*time.Second, "protected")
	e.create(e.prioritized("free", lowPriority, map[string]int64{"tessera.io/gpu": 1}))
	e.waitBound(30*time.Second, "free")
	pdb, err := e.client.PolicyV1().PodDisruptionBudgets(e.ns).Create(e.tCtx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the disruption controller (not running here) would report.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, DisruptionsAllowed: 0}
	if _, err := e.client.PolicyV1().PodDisruptionBudgets(e.ns).UpdateStatus(e.tCtx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(e.prioritized("urgent", highPriority, map[string]int64{"tessera.io/gpu": 1}))
	e.waitBound(60*time.Second, "urgent")
	if evicted := k.evicted(); len(evicted) != 1 || evicted[0] != "free" {
		t.Errorf("evicted %v, want only the unprotected pod", evicted)
	}
}

// TestNominatedPodKeepsItsCard: between the preemption and the preemptor's
// binding, the card its victim frees is kept for it; lower-priority pods
// that were waiting for room, and are retried first when the victim is gone,
// do not take it.
func TestNominatedPodKeepsItsCard(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("one", cluster.A100, 1, nil)
	e.startScheduler()
	half := map[string]int64{"tessera.io/gpu-memory": 40960, "tessera.io/gpu-cores": 10}
	e.create(e.prioritized("low-a", lowPriority, half))
	e.waitBound(30*time.Second, "low-a")
	e.create(e.prioritized("low-b", lowPriority, half))
	e.waitBound(30*time.Second, "low-b")
	// Waiting before the preemptor comes, these are tried again before it.
	latecomers := []string{"waiting-0", "waiting-1", "waiting-2"}
	for _, name := range latecomers {
		e.create(e.prioritized(name, lowPriority, half))
		e.waitUnschedulable(name)
	}
	e.create(e.prioritized("urgent", highPriority, half))
	// The preemption: a victim is terminating and the preemptor nominated.
	victim := e.waitNominated("urgent")
	// A terminating victim still holds its card (its process may still hold
	// the memory).
	if p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, "urgent", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("the preemptor was bound (%q, %v) while its victim was still terminating", p.Spec.NodeName, err)
	}
	// The victim's containers stop: every waiting pod is retried, at once —
	// not after kube-scheduler's five-minute unschedulable timeout.
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, victim.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.waitBound(10*time.Second, "urgent")
	t.Logf("the preemptor was bound %v after its victim was gone", time.Since(start).Round(time.Millisecond))
	// Had a waiting pod taken the card, it would have been bound and then
	// evicted in turn by the preemptor, or still hold the card.
	for _, name := range latecomers {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			t.Errorf("pod %s took the card freed for the preemptor (bound to %q, deleted %v, %v)", name, p.Spec.NodeName, p.DeletionTimestamp != nil, err)
		}
	}
	e.checkNoOvercommit(t)
}

// waitNominated waits for the preemptor's nomination and for a victim of it
// to be terminating (no kubelet confirms deletions in these tests, so the
// victim stays so until the test deletes it), and returns that victim.
func (e *env) waitNominated(preemptor string) *v1.Pod {
	e.tCtx.Helper()
	var victim *v1.Pod
	e.waitFor(30*time.Second, preemptor+"'s nomination and its victim", func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		nominated := false
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil && hasDisruptionTarget(p) {
				victim = p
			}
			nominated = nominated || (p.Name == preemptor && p.Status.NominatedNodeName != "")
		}
		return victim != nil && nominated, nil
	})
	return victim
}

// hasDisruptionTarget reports whether the scheduler marked the pod evicted
// by preemption.
func hasDisruptionTarget(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.DisruptionTarget && c.Reason == v1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}

// finishDeletion ends a pod's termination, as its kubelet would.
func (e *env) finishDeletion(name string) {
	e.tCtx.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil && !apierrors.IsNotFound(err) {
		e.tCtx.Fatal(err)
	}
}

// TestNominationHoldsItsCardsFromPeers: while a preemptor's victim is still
// terminating, a pod of the preemptor's own priority — which it may not
// preempt — races it for the node. The peer fits there now on either card;
// the spread profile would put it on the card the victim is freeing, where
// the preemptor will not fit beside it. The nomination holds that card: the
// peer takes the other one, and the preemptor gets the card it evicted for.
func TestNominationHoldsItsCardsFromPeers(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	node := e.node("two", cluster.A100, 2, nil)
	e.startScheduler()
	gib := func(n int64) map[string]int64 {
		return map[string]int64{"tessera.io/gpu-memory": n * 1024, "tessera.io/gpu-cores": 10}
	}
	e.create(e.prioritized("victim", lowPriority, gib(60)))
	victimCard := placementOf(t, e.waitBound(30*time.Second, "victim")["victim"]).Cards[0]
	e.create(e.prioritized("keeper", highPriority, gib(62)))
	keeperCard := placementOf(t, e.waitBound(30*time.Second, "keeper")["keeper"]).Cards[0]
	if keeperCard == victimCard {
		t.Fatalf("keeper shares card %d with the victim; the test needs them apart", keeperCard)
	}
	// 70 GiB: only the victim's card, once the victim is gone.
	e.create(e.prioritized("urgent", highPriority, gib(70)))
	if v := e.waitNominated("urgent"); v.Name != "victim" {
		t.Fatalf("the preemptor evicted %s, want victim", v.Name)
	}
	peer := e.podSpec("peer", "tessera-spread", gib(15))
	peer.Spec.PriorityClassName = highPriority
	e.create(peer)
	if got := placementOf(t, e.waitBound(30*time.Second, "peer")["peer"]); got.Node != node || got.Cards[0] != keeperCard {
		t.Errorf("the peer was placed on %+v, want card %d (the keeper's): the victim's card is the preemptor's", got, keeperCard)
	}
	e.finishDeletion("victim")
	if got := placementOf(t, e.waitBound(30*time.Second, "urgent")["urgent"]); got.Node != node || got.Cards[0] != victimCard {
		t.Errorf("the preemptor was placed on %+v, want the card it evicted for (%d)", got, victimCard)
	}
	e.checkNoOvercommit(t)
}

// TestTenantGracePeriodDoesNotPinThePreemptor: a preemptor nominated to a
// node waits there only for its own victims. A tenant's pod there that its
// owner deleted with a day's grace period (terminating, lower priority, but
// no victim of the scheduler) does not keep the preemptor from a card that
// frees elsewhere once its victim is gone.
func TestTenantGracePeriodDoesNotPinThePreemptor(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	nominated := e.node("nominated", cluster.A100, 1, nil)
	e.startScheduler()
	half := map[string]int64{"tessera.io/gpu-memory": 40960, "tessera.io/gpu-cores": 10}
	e.create(e.prioritized("victim", lowPriority, half))
	tenant := e.prioritized("tenant", lowPriority, half)
	tenant.Spec.TerminationGracePeriodSeconds = ptr.To(int64(86400))
	e.create(tenant)
	for name, p := range e.waitBound(30*time.Second, "victim", "tenant") {
		if p.Spec.NodeName != nominated {
			t.Fatalf("%s was placed on %s, want %s", name, p.Spec.NodeName, nominated)
		}
	}
	elsewhere := e.node("elsewhere", cluster.A100, 1, nil)
	e.create(e.prioritized("occupant", highPriority, map[string]int64{"tessera.io/gpu": 1}))
	if p := e.waitBound(30*time.Second, "occupant")["occupant"]; p.Spec.NodeName != elsewhere {
		t.Fatalf("occupant was placed on %s, want %s", p.Spec.NodeName, elsewhere)
	}
	// The tenant deletes its pod; its preStop would sleep for the day.
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, "tenant", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(e.prioritized("urgent", highPriority, map[string]int64{"tessera.io/gpu": 1}))
	if v := e.waitNominated("urgent"); v.Name != "victim" {
		t.Fatalf("the preemptor evicted %s, want victim", v.Name)
	}
	e.finishDeletion("victim")
	// The tenant's pod still holds half the nominated node's card; the card
	// elsewhere frees.
	e.finishDeletion("occupant")
	if p := e.waitBound(30*time.Second, "urgent")["urgent"]; p.Spec.NodeName != elsewhere {
		t.Errorf("the preemptor was placed on %s, want %s", p.Spec.NodeName, elsewhere)
	}
	e.checkNoOvercommit(t)
}

// TestEvictionMarkCannotBeForged: the scheduler holds a preemptor to a node
// (and keeps cards for it) only for pods marked DisruptionTarget with reason
// PreemptionByScheduler. A tenant who may create, update and delete pods in
// its namespace, and the node agent under its shipped identity, try to put that
// mark on a pod — to pin others' preemptors or keep cards from them — and
// cannot: pod status is not theirs to write, and a pod created with the mark
// has its status reset by the API server.
func TestEvictionMarkCannotBeForged(t *testing.T) {
	e := newEnv(t)
	node := e.node("n", cluster.A100, 1, nil)
	const tenant = "tenant-forger"
	// The rights on pods Kubernetes' edit role gives (its aggregated rules
	// need the controller manager, which does not run here).
	e.grantEditor(e.ns, tenant)
	mark := v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler}
	tenantClient := clientAs(t, tenant)

	// Created with the mark: the API server resets a new pod's status.
	forged := e.podSpec("forged", "tessera-binpack", nil)
	forged.Spec.NodeName = node
	forged.Status.Conditions = []v1.PodCondition{mark}
	created, err := tenantClient.CoreV1().Pods(e.ns).Create(e.tCtx, forged, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hasDisruptionTarget(created) {
		t.Error("a pod created by the tenant kept the DisruptionTarget mark it was created with")
	}
	// Written afterwards: the status subresource is refused to both.
	created.Status.Conditions = []v1.PodCondition{mark}
	for who, client := range map[string]kubernetes.Interface{
		"the tenant":     tenantClient,
		"the node agent": newClient(t, install.AsAgent(controlPlane.Config, node)),
	} {
		if _, err := client.CoreV1().Pods(e.ns).UpdateStatus(e.tCtx, created, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s wrote the DisruptionTarget mark on a pod's status: %v", who, err)
		}
	}
}
