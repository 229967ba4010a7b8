package ledger

import "github.com/tessera-gpu/tessera/pkg/allocator"

// CardUsage is one card's capacity and usage in a Snapshot.
type CardUsage struct {
	Index   int
	UUID    string
	Model   string
	Healthy bool
	// MIG marks a card in MIG mode: its slices, which follow it, hold its
	// pods.
	MIG bool
	// Slice, when set, makes this entry a MIG slice of the card before it.
	Slice    *allocator.Slice
	Capacity allocator.Usage
	Used     allocator.Usage
	// Pods is how many pods (bound or assumed) hold part of the card.
	Pods int
}

// Snapshot returns every node with a valid inventory and the usage of each of
// its cards. It is for tests, tools and metrics, not the scheduling path.
func (l *Ledger) Snapshot() map[string][]CardUsage {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string][]CardUsage, len(l.nodes))
	for name, n := range l.nodes {
		if n.err == nil {
			out[name] = l.cardsLocked(n)
		}
	}
	return out
}

// NodeCards returns the usage of each card of the node, or nil when it has
// no valid inventory.
func (l *Ledger) NodeCards(name string) []CardUsage {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if n := l.nodes[name]; n != nil && n.err == nil {
		return l.cardsLocked(n)
	}
	return nil
}

func (l *Ledger) cardsLocked(n *node) []CardUsage {
	cards := make([]CardUsage, len(n.cards))
	for i, c := range n.cards {
		cards[i] = CardUsage{Index: c.Index, UUID: c.UUID, Model: c.Model, Healthy: c.Healthy, MIG: c.MIG, Slice: c.Slice, Capacity: c.Capacity, Used: n.used[i]}
	}
	for uid := range n.pods {
		for i, charge := range l.pods[uid].charge {
			if i < len(cards) && charge != (allocator.Usage{}) {
				cards[i].Pods++
			}
		}
	}
	return cards
}

// Fragmentation sums, over every node with a valid inventory, its
// fragmentation with respect to the workload and its free GPU, in per mille
// of a card (allocator.Fragmentation). It is for metrics, not the scheduling
// path.
func (l *Ledger) Fragmentation(w *allocator.Workload) (fragmented, free float64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, n := range l.nodes {
		if n.err != nil {
			continue
		}
		f, total := allocator.Fragmentation(w, n.cards, n.used)
		fragmented += f
		free += total
	}
	return fragmented, free
}

// InventoryGeneration is a number that changes whenever an inventory does,
// so that what a caller derives from UsableCardsByModel can be kept until
// then.
func (l *Ledger) InventoryGeneration() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.inventories
}

// UsableCardsByModel counts the fleet's usable cards (healthy, not in MIG
// mode, not slices, on nodes with a valid inventory) by lower-case model.
func (l *Ledger) UsableCardsByModel() map[string]int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	counts := map[string]int{}
	for _, n := range l.nodes {
		if n.err != nil {
			continue
		}
		for i := range n.cards {
			if n.cards[i].TakesShares() {
				counts[n.cards[i].ModelLower]++
			}
		}
	}
	return counts
}
