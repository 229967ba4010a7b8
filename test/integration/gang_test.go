package integration

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
)

// gang creates a PodGroup of minCount pods, all-or-nothing, and its pods
// (name-0 …), each asking for limits; it returns the pods' names.
func (e *env) gang(name string, minCount int, limits map[string]int64) []string {
	e.tCtx.Helper()
	return e.gangWith(name, "tessera-binpack", "", minCount, limits)
}

// gangWith is gang with the members placed by the given profile and in a
// priority class (none for "").
func (e *env) gangWith(name, scheduler, class string, minCount int, limits map[string]int64) []string {
	e.tCtx.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(minCount)},
			},
			PriorityClassName: class,
		},
	}
	if _, err := e.client.SchedulingV1beta1().PodGroups(e.ns).Create(e.tCtx, pg, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	var names []string
	for i := 0; i < minCount; i++ {
		pod := e.podSpec(fmt.Sprintf("%s-%d", name, i), scheduler, limits)
		pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To(name)}
		pod.Spec.PriorityClassName = class
		e.create(pod)
		names = append(names, pod.Name)
	}
	return names
}

// bound counts the named pods bound to a node.
func (e *env) bound(names []string) int {
	e.tCtx.Helper()
	n := 0
	for _, name := range names {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			e.tCtx.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// waitTried waits until every named pod has been tried and found
// unschedulable at least once, or bound.
func (e *env) waitTried(names []string) {
	e.tCtx.Helper()
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if _, tried := unschedulableMessageOf(p); !tried && p.Spec.NodeName == "" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.tCtx.Fatalf("pods %v were not all tried: %v", names, err)
	}
}

func unschedulableMessageOf(p *v1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message, true
		}
	}
	return "", false
}

// TestGangBindsWhole: a gang of 4 pods × 2 whole cards on a fleet with
// room binds whole, on cards no other pod holds.
func TestGangBindsWhole(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.node("c", cluster.A100, 4, nil)
	e.startScheduler()
	e.create(e.podSpec("share", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 20}))
	e.waitBound(30*time.Second, "share")
	workers := e.gang("train", 4, map[string]int64{"tessera.io/gpu": 2})
	e.waitBound(60*time.Second, workers...)
	if n := e.checkNoOvercommit(t); n != 5 {
		t.Errorf("%d GPU pods bound, want 5", n)
	}
}

// TestGangPreemptsGPUPods: a high-priority gang that fits only once
// lower-priority pods are gone evicts them — kube-scheduler's pod-group
// preemption, whose dry run removes its potential victims from its snapshot
// without telling the plugins — and binds whole on the cards they held.
func TestGangPreemptsGPUPods(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("a", cluster.A100, 2, nil)
	e.startScheduler()
	k := e.startKubelet()
	low := []string{"low-0", "low-1"}
	for _, name := range low {
		e.create(e.prioritized(name, lowPriority, map[string]int64{"tessera.io/gpu": 1}))
	}
	e.waitBound(30*time.Second, low...)
	workers := e.gangWith("train", "tessera-binpack", highPriority, 2, map[string]int64{"tessera.io/gpu": 1})
	e.waitBound(60*time.Second, workers...)
	if evicted := k.evicted(); !slices.Equal(evicted, low) {
		t.Errorf("evicted %v, want %v", evicted, low)
	}
	if n := e.checkNoOvercommit(t); n != 2 {
		t.Errorf("%d GPU pods bound, want the gang's 2", n)
	}
}

// TestGangThatCannotFitHoldsNothing: a gang needing more cards than are free
// binds no pod and holds no card: a shared pod submitted after it binds.
func TestGangThatCannotFitHoldsNothing(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.startScheduler()
	workers := e.gang("huge", 3, map[string]int64{"tessera.io/gpu": 4})
	e.waitTried(workers)
	e.create(e.podSpec("share", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 8192}))
	e.waitBound(30*time.Second, "share")
	if n := e.bound(workers); n != 0 {
		t.Errorf("%d of the gang's pods bound, want none", n)
	}
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, workers[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := unschedulableMessageOf(p)
	t.Logf("a gang member's condition: %s", msg)
	e.checkNoOvercommit(t)
}

// TestCompetingGangs: two gangs that each need the whole fleet: exactly one
// binds whole, the other holds nothing; deleting the first lets the second
// bind, without waiting for the gang timeout.
func TestCompetingGangs(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.startScheduler()
	first := e.gang("first", 4, map[string]int64{"tessera.io/gpu": 2})
	second := e.gang("second", 4, map[string]int64{"tessera.io/gpu": 2})
	var winner, loser []string
	err := wait.PollUntilContextTimeout(e.tCtx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		switch {
		case e.bound(first) == 4:
			winner, loser = first, second
		case e.bound(second) == 4:
			winner, loser = second, first
		}
		return winner != nil, nil
	})
	if err != nil {
		t.Fatalf("no gang bound whole: %d and %d pods bound", e.bound(first), e.bound(second))
	}
	e.waitTried(loser)
	if n := e.bound(loser); n != 0 {
		t.Errorf("the other gang has %d pods bound, want none", n)
	}
	e.checkNoOvercommit(t)
	for _, name := range winner {
		e.deletePod(name)
	}
	e.waitBound(60*time.Second, loser...)
	e.checkNoOvercommit(t)
}

// TestGangSharesCardsWithOrdinaryPods: gang members with fractional shares
// and ordinary pods on the same cards; nothing is over-committed.
func TestGangSharesCardsWithOrdinaryPods(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.T4, 2, nil)
	e.startScheduler()
	for i := 0; i < 3; i++ {
		e.create(e.podSpec(fmt.Sprint("solo-", i), "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 20}))
	}
	workers := e.gang("serve", 3, map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 20})
	e.waitBound(60*time.Second, append(workers, "solo-0", "solo-1", "solo-2")...)
	if n := e.checkNoOvercommit(t); n != 6 {
		t.Errorf("%d GPU pods bound, want 6", n)
	}
}

// TestRandomizedGangs runs seeded rounds of gangs (2–3 pods) and single
// pods of random shapes over two nodes of four cards, with deletions of
// whole gangs and single pods, and checks after each round, from the API's
// objects: every gang is bound whole or not at all, and no card is
// over-committed (recomputed apart from the scheduler's code).
func TestRandomizedGangs(t *testing.T) {
	// The fragmentation-aware profile learns from every member it sees, so
	// its placements change between a group's dry run and its real pass
	// (Reserve replays the dry run's).
	for seed, profile := range map[int64]string{1: "tessera-binpack", 2: "tessera-fragmentation-aware", 3: "tessera-fragmentation-aware"} {
		t.Run(fmt.Sprintf("seed%d-%s", seed, profile), func(t *testing.T) {
			e := newEnv(t)
			e.node("a", cluster.A100, 4, nil)
			e.node("b", cluster.A100, 4, nil)
			e.startScheduler()
			r := rand.New(rand.NewSource(seed))
			gangs := map[string][]string{}
			var solos []string
			next := 0
			for round := 0; round < 4; round++ {
				for i := 0; i < 2+r.Intn(3); i++ {
					next++
					shape := randomShapes[r.Intn(len(randomShapes))]
					if r.Intn(2) == 0 {
						name := fmt.Sprintf("g%d", next)
						gangs[name] = e.gangWith(name, profile, "", 2+r.Intn(2), shape)
					} else {
						name := fmt.Sprintf("s%d", next)
						e.create(e.podSpec(name, profile, shape))
						solos = append(solos, name)
					}
				}
				e.settle()
				e.waitFor(30*time.Second, "every gang bound whole or not at all", func() (bool, error) {
					for _, members := range gangs {
						if n := e.bound(members); n != 0 && n != len(members) {
							return false, nil
						}
					}
					return true, nil
				})
				whole, waiting := 0, 0
				for _, members := range gangs {
					if e.bound(members) == 0 {
						waiting++
					} else {
						whole++
					}
				}
				t.Logf("round %d: %d gangs bound whole, %d waiting holding nothing; %d GPU pods bound", round, whole, waiting, e.checkNoOvercommit(t))
				// Delete a gang and a single pod, at random.
				for name, members := range gangs {
					if r.Intn(2) == 0 {
						for _, m := range members {
							e.deletePod(m)
						}
						delete(gangs, name)
						break
					}
				}
				if len(solos) > 0 && r.Intn(2) == 0 {
					i := r.Intn(len(solos))
					e.deletePod(solos[i])
					solos = append(solos[:i], solos[i+1:]...)
				}
			}
		})
	}
}
