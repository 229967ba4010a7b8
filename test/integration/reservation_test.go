package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/apis/reservation/v1alpha1"
)

// TestReservationKeepsCardsForCriticalPods: a GPUReservation keeps two of a
// node's four cards for priority >= 1000. A low-priority burst takes the
// other two and waits, told why; a critical pod then starts at once, with no
// eviction; deleting the reservation lets a waiting pod in at once.
func TestReservationKeepsCardsForCriticalPods(t *testing.T) {
	e := newEnv(t)
	e.priorityClasses()
	e.node("pool", cluster.A100, 4, map[string]string{"pool": e.ns})
	reservations, err := dynamic.NewForConfig(controlPlane.Config)
	if err != nil {
		t.Fatal(err)
	}
	gr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "tessera.io/v1alpha1", "kind": "GPUReservation",
		"metadata": map[string]any{"name": e.ns},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"pool": e.ns}},
			"cards":        int64(2),
			"for":          map[string]any{"minPriority": int64(1000)},
		},
	}}
	if _, err := reservations.Resource(v1alpha1.Resource).Create(e.tCtx, gr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = reservations.Resource(v1alpha1.Resource).Delete(context.Background(), e.ns, metav1.DeleteOptions{})
	})
	e.startScheduler()
	k := e.startKubelet()

	var burst []string
	for i := 0; i < 4; i++ {
		burst = append(burst, fmt.Sprint("batch-", i))
		e.create(e.prioritized(burst[i], lowPriority, map[string]int64{"tessera.io/gpu": 1}))
	}
	waiting := e.waitSettled(burst, 2)
	for _, name := range waiting {
		if msg := e.waitUnschedulable(name); !strings.Contains(msg, "2 GPUs reserved for priority >= 1000 by GPUReservation "+e.ns) {
			t.Errorf("pod %s waits with %q, which does not name the reservation", name, msg)
		}
	}
	e.create(e.prioritized("critical", highPriority, map[string]int64{"tessera.io/gpu": 1}))
	e.waitBound(10*time.Second, "critical")
	if evicted := k.evicted(); len(evicted) != 0 {
		t.Errorf("the critical pod evicted %v; the reserved cards were there for it", evicted)
	}

	if err := reservations.Resource(v1alpha1.Resource).Delete(e.tCtx, e.ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if still := e.waitSettled(waiting, 1); len(still) != 1 {
		t.Errorf("after the reservation went, %v still wait; want one in the last card", still)
	}
	t.Logf("a waiting pod was bound %v after the reservation was deleted", time.Since(start).Round(time.Millisecond))
	e.checkNoOvercommit(t)
}

// waitSettled waits until exactly bound of the named pods are bound, and
// returns the others.
func (e *env) waitSettled(names []string, bound int) []string {
	e.tCtx.Helper()
	var pending []string
	e.waitFor(30*time.Second, fmt.Sprintf("%d of %v bound", bound, names), func() (bool, error) {
		pending = nil
		n := 0
		for _, name := range names {
			p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Spec.NodeName != "" {
				n++
				continue
			}
			pending = append(pending, name)
		}
		return n == bound, nil
	})
	return pending
}
