package integration

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// randomShapes are the GPU requests of the randomized preemption test.
var randomShapes = []map[string]int64{
	{"tessera.io/gpu": 1},
	{"tessera.io/gpu": 2},
	{"tessera.io/gpu-memory": 20480, "tessera.io/gpu-cores": 20},
	{"tessera.io/gpu-memory": 40960, "tessera.io/gpu-cores": 40},
}

// TestRandomizedPreemption runs seeded rounds of arrivals at three
// priorities and deletions over two nodes of four cards, lets each round
// settle, and checks after it, against a recomputation from the API's
// objects: no card is over-committed; every pod evicted was evicted for a
// preemptor now bound on the victim's node; and no pending pod could be
// placed by evicting only pods of lower priority than its own.
func TestRandomizedPreemption(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := newEnv(t)
			e.priorityClasses()
			e.node("a", cluster.A100, 4, nil)
			e.node("b", cluster.A100, 4, nil)
			e.startScheduler()
			k := e.startKubelet()
			r := rand.New(rand.NewSource(seed))
			classes := []string{lowPriority, midPriority, highPriority}
			next := 0
			for round := 0; round < 5; round++ {
				for i := 0; i < 4+r.Intn(4); i++ {
					name := fmt.Sprintf("r%d-%d", round, next)
					next++
					e.create(e.prioritized(name, classes[r.Intn(len(classes))], randomShapes[r.Intn(len(randomShapes))]))
				}
				pods := e.settleWithoutMissedPreemption()
				e.checkNoOvercommit(t)
				e.checkEvictionsServedPreemptors(t, k, pods)
				for i := 0; i < r.Intn(3) && len(pods) > 0; i++ {
					e.deletePod(pods[r.Intn(len(pods))].Name)
				}
			}
			preemptions, err := cluster.Preemptions(e.tCtx, e.client, e.ns)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("pods evicted over the rounds: %d; %s", len(k.evicted()), eventDelays(preemptions))
		})
	}
}

// eventDelays summarises how late the Preempted Events reached the API
// server (for docs/performance.md; go test -v prints it).
func eventDelays(preemptions []cluster.Preemption) string {
	if len(preemptions) == 0 {
		return "no Preempted events"
	}
	delays := make([]time.Duration, len(preemptions))
	for i, p := range preemptions {
		delays[i] = p.Delay
	}
	slices.Sort(delays)
	at := func(q float64) time.Duration { return delays[min(len(delays)-1, int(q*float64(len(delays))))] }
	return fmt.Sprintf("Preempted events %d, delay p50 %v p99 %v max %v", len(delays), at(0.5), at(0.99), delays[len(delays)-1])
}

func (e *env) listPods() []v1.Pod {
	e.tCtx.Helper()
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return pods.Items
}

// settle waits until every pod of the namespace is bound or marked
// unschedulable without a nomination pending, and none is terminating, and
// returns them.
func (e *env) settle() []v1.Pod {
	e.tCtx.Helper()
	var pods []v1.Pod
	var unsettled []string
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		pods, unsettled = e.listPods(), nil
		for _, p := range pods {
			if p.DeletionTimestamp != nil || p.Spec.NodeName == "" && (p.Status.NominatedNodeName != "" || !unschedulable(&p)) {
				unsettled = append(unsettled, fmt.Sprintf("%s (priority %d): terminating %t, nominated %q, pending: %s",
					p.Name, priority(&p), p.DeletionTimestamp != nil, p.Status.NominatedNodeName, podMessage(&p)))
			}
		}
		return len(unsettled) == 0, nil
	})
	if err != nil {
		e.tCtx.Fatalf("the round did not settle in 60s:\n%s\nall pods:\n%s", strings.Join(unsettled, "\n"), e.podsNow())
	}
	return pods
}

func unschedulable(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return true
		}
	}
	return false
}

// checkEvictionsServedPreemptors: every pod the kubelet saw evicted by the
// scheduler (marked DisruptionTarget; the test's own deletions are not)
// whose Preempted Event has come was evicted for a preemptor bound to its node
// — unless the test has deleted the preemptor since, or a pod of higher
// priority than the preemptor's, which may always take a nominated pod's
// room, holds cards on that node.
func (e *env) checkEvictionsServedPreemptors(t *testing.T, k kubelet, pods []v1.Pod) {
	t.Helper()
	victims, nodes := k.Terminated()
	var preemptions []cluster.Preemption
	// Events are written asynchronously (within a second here, even under
	// load: docs/performance.md) and are best effort in Kubernetes: wait a
	// while for every victim's, then check those there are; an eviction
	// whose event has not come is not checked.
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		preemptions, err = cluster.Preemptions(ctx, e.client, e.ns)
		return err == nil && len(preemptions) >= len(victims), nil
	})
	if err != nil {
		// The last try may have been cut short by the deadline: look once more.
		if preemptions, err = cluster.Preemptions(e.tCtx, e.client, e.ns); err != nil {
			t.Fatal(err)
		}
		t.Logf("evicted %v; Preempted events found for %d of them", victims, len(preemptions))
	}

	for _, p := range preemptions {
		// A victim chosen while its own binding was under way (the
		// scheduler's cache holds it on the node) was deleted before it
		// named one.
		if node, ok := nodes[p.Victim]; ok && node != "" && node != p.Node {
			t.Errorf("%s ran on %s, its Preempted event says %s", p.Victim, node, p.Node)
		}
		name := p.Preemptor[strings.Index(p.Preemptor, "/")+1:]
		i := slices.IndexFunc(pods, func(q v1.Pod) bool { return q.Name == name })
		if i < 0 || pods[i].Spec.NodeName == p.Node {
			continue
		}
		outranked := slices.ContainsFunc(pods, func(q v1.Pod) bool {
			return q.Spec.NodeName == p.Node && priority(&q) > priority(&pods[i])
		})
		if !outranked {
			t.Errorf("%s was evicted from %s for %s, which is bound to %q", p.Victim, p.Node, name, pods[i].Spec.NodeName)
		}
	}
}

// settleWithoutMissedPreemption waits until the round has settled and no
// pending pod could be placed by evicting pods of lower priority (a pod
// marked unschedulable may still be retried after the round's last event, so
// this is waited for rather than checked once), and returns the pods.
func (e *env) settleWithoutMissedPreemption() []v1.Pod {
	e.tCtx.Helper()
	var pods []v1.Pod
	var missed []string
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pods = e.settle()
		missed = e.missedPreemptions(pods)
		return len(missed) == 0, nil
	})
	if err != nil {
		e.tCtx.Fatalf("pending pods that evicting lower-priority pods would place:\n%s\nall pods:\n%s", strings.Join(missed, "\n"), e.podsNow())
	}
	return pods
}

// missedPreemptions lists the pending pods for which some node would offer
// room once all pods of lower priority than their own were gone —
// recomputed with the contract's rules, apart from the scheduler's code.
func (e *env) missedPreemptions(pods []v1.Pod) []string {
	t := e.tCtx
	cards, capacity := e.nodeCards(t)
	var missed []string
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		var kept []v1.Pod
		for _, q := range pods {
			if q.Spec.NodeName != "" && priority(&q) >= priority(&p) {
				kept = append(kept, q)
			}
		}
		held, err := testutil.HeldByPods(kept, capacity)
		if err != nil {
			t.Fatal(err)
		}
		for node, nodeCards := range cards {
			if fitsBeside(&p, nodeCards, held) {
				missed = append(missed, fmt.Sprintf("pod %s (priority %d), on %s: %s", p.Name, priority(&p), node, podMessage(&p)))
			}
		}
	}
	return missed
}

func priority(p *v1.Pod) int32 {
	if p.Spec.Priority == nil {
		return 0
	}
	return *p.Spec.Priority
}

func podMessage(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled {
			return c.Message
		}
	}
	return ""
}

// fitsBeside reports whether the pod's one container (a randomShapes
// request) fits on the node's cards beside what held takes: whole cards need
// cards nothing holds, a share a card with its memory and compute free.
func fitsBeside(p *v1.Pod, cards []gpuinfo.Card, held map[string]testutil.Use) bool {
	limits := p.Spec.Containers[0].Resources.Limits
	if n, ok := limits["tessera.io/gpu"]; ok {
		free := 0
		for _, c := range cards {
			if held[c.UUID] == (testutil.Use{}) {
				free++
			}
		}
		return int64(free) >= n.Value()
	}
	memory, cores := limits["tessera.io/gpu-memory"], limits["tessera.io/gpu-cores"]
	for _, c := range cards {
		h := held[c.UUID]
		if c.MemoryMiB-h.MemoryMiB >= memory.Value() && c.Cores-h.Cores >= cores.Value() {
			return true
		}
	}
	return false
}
