package ledger

import "github.com/tessera-gpu/tessera/pkg/allocator"

// CardUsage is one card's capacity and usage in a Snapshot.
type CardUsage struct {
	Index    int
	UUID     string
	Model    string
	Healthy  bool
	Capacity allocator.Usage
	Used     allocator.Usage
}

// Snapshot returns every node with a valid inventory and the usage of each of
// its cards. It is for tests, tools and metrics, not the scheduling path.
func (l *Ledger) Snapshot() map[string][]CardUsage {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string][]CardUsage, len(l.nodes))
	for name, n := range l.nodes {
		if n.err != nil {
			continue
		}
		cards := make([]CardUsage, len(n.cards))
		for i, c := range n.cards {
			cards[i] = CardUsage{Index: c.Index, UUID: c.UUID, Model: c.Model, Healthy: c.Healthy, Capacity: c.Capacity, Used: n.used[i]}
		}
		out[name] = cards
	}
	return out
}
