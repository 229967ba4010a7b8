package integration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// checkNoOvercommit rebuilds the card usage of the test's nodes from the API
// alone — node inventories and bound pods' assignments — and fails if any
// card holds more memory or compute than it has. It returns the number of
// bound GPU pods it counted.
func (e *env) checkNoOvercommit(t *testing.T) int {
	t.Helper()
	l := ledger.New()
	for _, name := range e.nodes {
		n, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		raw, ok := n.Annotations[gpuinfo.InventoryAnnotation]
		if _, err := l.SetInventory(name, "", raw, ok); err != nil {
			continue // nodes with bad inventories hold no GPU pods
		}
	}
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		raw, ok := p.Annotations[gpuinfo.AssignmentAnnotation]
		if p.Spec.NodeName == "" || !ok {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(raw)
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		l.AddPod(p.UID, p.Spec.NodeName, gpuinfo.ContainerOrder(p), a, false)
		bound++
	}
	for node, cards := range l.Snapshot() {
		for _, c := range cards {
			if c.Used.MemoryMiB > c.Capacity.MemoryMiB || c.Used.Cores > c.Capacity.Cores {
				t.Errorf("node %s card %d is over-committed: %+v of %+v", node, c.Index, c.Used, c.Capacity)
			}
		}
	}
	return bound
}
