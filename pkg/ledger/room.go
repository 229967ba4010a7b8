package ledger

import (
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// room is what a node's usable cards (healthy, not in MIG mode; MIG slices
// are not counted) have free:
// an upper bound on what a container can get there, kept current as usage
// changes so that PreFilter can rule nodes out without placing anything.
type room struct {
	// maxMemoryMiB and maxCores are the most memory and the most compute
	// free on any usable card (not necessarily the same card).
	maxMemoryMiB, maxCores int64
	// maxMemoryPermille bounds from above the memory free on a usable card,
	// in per mille of that card's memory.
	maxMemoryPermille int64
	// freeCards counts usable cards with nothing on them; cardsWithRoom those
	// with some memory free.
	freeCards, cardsWithRoom int
}

// summarize recomputes the node's room from its cards and usage.
func (n *node) summarize() {
	var r room
	for i := range n.cards {
		c := &n.cards[i]
		if !c.TakesShares() || i >= len(n.used) {
			continue
		}
		free := allocator.Usage{MemoryMiB: c.Capacity.MemoryMiB - n.used[i].MemoryMiB, Cores: c.Capacity.Cores - n.used[i].Cores}
		r.maxMemoryMiB = max(r.maxMemoryMiB, free.MemoryMiB)
		r.maxCores = max(r.maxCores, free.Cores)
		if c.Capacity.MemoryMiB > 0 {
			// Rounded up from one MiB more than is free, so that a share
			// Place grants (capacity × percent / 100, rounded down) is never
			// ruled out.
			r.maxMemoryPermille = max(r.maxMemoryPermille, ((free.MemoryMiB+1)*1000+c.Capacity.MemoryMiB-1)/c.Capacity.MemoryMiB)
		}
		if free == c.Capacity {
			r.freeCards++
		}
		if free.MemoryMiB > 0 {
			r.cardsWithRoom++
		}
	}
	n.room = r
}

// mayHold reports whether a container could possibly be placed on the
// node: false only when no placement can exist, whatever the selectors,
// reservations and card choice (it errs towards true).
func (r *room) mayHold(c *gpuinfo.ContainerRequest) bool {
	if c.Exclusive() {
		return r.freeCards >= c.Count
	}
	if r.cardsWithRoom < c.Count || r.maxCores < c.Cores {
		return false
	}
	switch {
	case c.MemoryMiB > 0:
		return r.maxMemoryMiB >= c.MemoryMiB
	case c.MemoryPercent > 0:
		return r.maxMemoryPermille >= c.MemoryPercent*10
	}
	return r.maxMemoryPermille >= 1000 // cores only: the card's whole memory
}

// Reader answers questions from one consistent view of the ledger; it is
// valid only inside the function given to Read, and must not call the
// ledger's other methods.
type Reader struct{ l *Ledger }

// Read calls fn with the ledger read-locked: many questions for the price
// of one lock.
func (l *Ledger) Read(fn func(Reader)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	fn(Reader{l})
}

// MayHold reports whether the node's usable cards could hold a pod of one
// GPU container: false only when no placement can exist there (no valid
// inventory, or no card with the room). It is PreFilter's cheap test for
// ruling nodes out; Filter gives the exact answer. A node object the ledger
// has not caught up with (a newer inventory annotation) may hold anything.
func (r Reader) MayHold(node *v1.Node, c *gpuinfo.ContainerRequest) bool {
	n, current := r.l.lookup(node)
	if !current {
		_, present := node.Annotations[gpuinfo.InventoryAnnotation]
		return present
	}
	return n != nil && n.err == nil && n.room.mayHold(c)
}

// NodesWithFreeCards is how many nodes with a valid inventory have at least
// count usable cards with nothing on them: each may hold any container of
// count cards that one card can hold, so PreFilter can tell without a pass
// over the nodes when too many may hold a pod for pruning to pay.
func (r Reader) NodesWithFreeCards(count int) int {
	total := 0
	for _, n := range r.l.byFreeCards[max(count, 0):] {
		total += n
	}
	return total
}
