package integration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// checkNoOvercommit recomputes, from the API alone and with the contract's
// rules written apart from the scheduler's code (testutil.HeldByPods), what
// the test's bound, unfinished pods hold on each card of the test's nodes,
// and fails if any card holds more memory or compute than its inventory
// gives it. It returns the number of bound GPU pods it counted.
func (e *env) checkNoOvercommit(t *testing.T) int {
	t.Helper()
	cards, capacity := e.nodeCards(t)
	where := map[string]string{}
	for node, nodeCards := range cards {
		for _, c := range nodeCards {
			where[c.UUID] = node
		}
	}
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := testutil.HeldByPods(pods.Items, capacity)
	if err != nil {
		t.Fatal(err)
	}
	for uuid, h := range held {
		if c := capacity[uuid]; h.MemoryMiB > c.MemoryMiB || h.Cores > c.Cores {
			t.Errorf("node %s card %s is over-committed: %+v of %+v", where[uuid], uuid, h, c)
		}
	}
	bound := 0
	for _, p := range pods.Items {
		if _, ok := p.Annotations[gpuinfo.AssignmentAnnotation]; ok && p.Spec.NodeName != "" {
			bound++
		}
	}
	return bound
}

// nodeCards reads the inventories of the test's nodes: each node's cards, and
// each card's capacity by UUID. Nodes with bad inventories offer no cards.
func (e *env) nodeCards(t interface {
	Helper()
	Fatal(...any)
}) (map[string][]gpuinfo.Card, map[string]testutil.Use) {
	t.Helper()
	cards := map[string][]gpuinfo.Card{}
	capacity := map[string]testutil.Use{}
	for _, name := range e.nodes {
		n, err := e.client.CoreV1().Nodes().Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv, err := gpuinfo.DecodeInventory(n.Annotations[gpuinfo.InventoryAnnotation])
		if err != nil {
			continue
		}
		cards[name] = inv.Cards
		for _, c := range inv.Cards {
			capacity[c.UUID] = testutil.Use{MemoryMiB: c.MemoryMiB, Cores: c.Cores}
		}
	}
	return cards, capacity
}
