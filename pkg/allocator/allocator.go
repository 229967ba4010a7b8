// Package allocator chooses cards for a pod's containers on one node. It is
// the single placement routine behind the scheduler plugin's Filter, Score and
// Reserve and the trace simulator, so what Filter admits is exactly what
// Reserve places. It is pure Go, deterministic, and does not allocate on the
// feasibility path.
package allocator

import (
	"strings"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Policy decides which cards a container gets among those that fit.
type Policy uint8

const (
	// Binpack picks the tightest fit: the card left with the least free.
	Binpack Policy = iota
	// Spread picks the least used card.
	Spread
	// FragmentationAware picks the card that raises the node's
	// fragmentation with respect to the expected workload least (ties go
	// to the tightest fit). Pods with several GPU containers, and placements
	// without a workload, are placed as Binpack.
	FragmentationAware
)

// Strategy is a policy with what it needs to know about the node.
type Strategy struct {
	Policy Policy
	// Workload, when set, makes Place report the placement's fragmentation
	// delta and lets FragmentationAware choose cards by it.
	Workload *Workload
	// CPUFreeMilli is the node's unrequested CPU and CPUMilli the pod's CPU
	// request; both count only with a Workload.
	CPUFreeMilli, CPUMilli int64
	// Reserve is how many entirely free healthy cards of the node the pod
	// must leave entirely free (capacity reserved for other pods).
	Reserve int
}

// Usage is an amount of memory and compute on one card.
type Usage struct {
	MemoryMiB int64
	Cores     int64
}

func (u Usage) add(o Usage) Usage { return Usage{u.MemoryMiB + o.MemoryMiB, u.Cores + o.Cores} }
func (u Usage) sub(o Usage) Usage { return Usage{u.MemoryMiB - o.MemoryMiB, u.Cores - o.Cores} }
func (u Usage) covers(o Usage) bool {
	return u.MemoryMiB >= o.MemoryMiB && u.Cores >= o.Cores
}

// Card is one card as the allocator sees it.
type Card struct {
	Index      int
	UUID       string
	Model      string
	ModelLower string
	UUIDLower  string
	Capacity   Usage
	// Healthy is false for a card that must get no new work: unhealthy, or
	// in MIG mode (MIG marks which).
	Healthy bool
	// MIG marks a card in MIG mode: its parent UUID gives a container no
	// usable device, so Tessera does not place pods on it yet.
	MIG bool
}

// NewCards converts an inventory's cards.
func NewCards(inv *gpuinfo.Inventory) []Card {
	cards := make([]Card, len(inv.Cards))
	for i, c := range inv.Cards {
		cards[i] = NewCard(c)
	}
	return cards
}

// NewCard converts one card of an inventory, or one published as a DRA
// device.
func NewCard(c gpuinfo.Card) Card {
	return Card{
		Index:      c.Index,
		UUID:       c.UUID,
		Model:      c.Model,
		ModelLower: strings.ToLower(c.Model),
		UUIDLower:  strings.ToLower(c.UUID),
		Capacity:   Usage{MemoryMiB: c.MemoryMiB, Cores: c.Cores},
		Healthy:    c.Healthy && !c.MIGEnabled,
		MIG:        c.MIGEnabled,
	}
}

// need returns what a container takes from a card: an exclusive container
// takes all of it.
func need(c *gpuinfo.ContainerRequest, card *Card) Usage {
	if c.Exclusive() {
		return card.Capacity
	}
	return Usage{MemoryMiB: max(c.MemoryOn(card.Capacity.MemoryMiB), 1), Cores: c.Cores}
}

// entryCharge returns what an assignment entry holds on a card.
func entryCharge(e *gpuinfo.CardAssignment, card *Card) Usage {
	if e.Cores >= gpuinfo.FullCores {
		return card.Capacity
	}
	return Usage{MemoryMiB: e.MemoryMiB, Cores: e.Cores}
}
