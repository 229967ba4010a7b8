package integration

import (
	"testing"

	v1 "k8s.io/api/core/v1"

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
	u := e.usage(t)
	for uuid, h := range u.held {
		if c := u.capacity[uuid]; h.MemoryMiB > c.MemoryMiB || h.Cores > c.Cores {
			t.Errorf("node %s card %s is over-committed: %+v of %+v", u.where[uuid].node, uuid, h, c)
		}
	}
	bound := 0
	for _, p := range u.pods {
		if _, ok := p.Annotations[gpuinfo.AssignmentAnnotation]; ok && p.Spec.NodeName != "" {
			bound++
		}
	}
	return bound
}

// nodeCards reads the inventories of the test's nodes: each node's cards, and
// each card's (and MIG slice's) capacity by UUID. Nodes with bad inventories offer no cards.
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
			if c.MIG == nil {
				continue
			}
			for _, in := range c.MIG.Instances {
				capacity[in.UUID] = testutil.Use{MemoryMiB: c.MIG.Profile(in.Profile).MemoryMiB, Cores: gpuinfo.FullCores}
			}
		}
	}
	return cards, capacity
}

// cardUsage is what the test's pods hold on the test's nodes' cards,
// recomputed from the API with the contract's rules (testutil.HeldByPods).
type cardUsage struct {
	// where locates each card (by UUID).
	where map[string]cardPlace
	// capacity and held are by card UUID.
	capacity, held map[string]testutil.Use
	// pods are the namespace's pods, as listed.
	pods []v1.Pod
}

// cardPlace is a card's node and index.
type cardPlace struct {
	node  string
	index int
}

// usage computes cardUsage.
func (e *env) usage(t *testing.T) cardUsage {
	t.Helper()
	cards, capacity := e.nodeCards(t)
	u := cardUsage{where: map[string]cardPlace{}, capacity: capacity}
	for node, nodeCards := range cards {
		for _, c := range nodeCards {
			u.where[c.UUID] = cardPlace{node, c.Index}
			if c.MIG != nil {
				for _, in := range c.MIG.Instances {
					u.where[in.UUID] = cardPlace{node, c.Index}
				}
			}
		}
	}
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.pods = pods.Items
	if u.held, err = testutil.HeldByPods(u.pods, capacity); err != nil {
		t.Fatal(err)
	}
	return u
}
