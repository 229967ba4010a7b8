package gpuinfo

import (
	"fmt"
	"sort"
)

// InventoryVersion is the version of the inventory format this package writes
// and reads.
const InventoryVersion = 1

// maxModelLength bounds a card's model name.
const maxModelLength = 256

// Inventory is the content of a node's InventoryAnnotation.
type Inventory struct {
	Version int    `json:"version"`
	Cards   []Card `json:"cards"`
}

// Card is one GPU as the node agent reports it.
type Card struct {
	// Index is the card's NVML index on the node, 0 to MaxCardsPerNode-1.
	Index int `json:"index"`
	// UUID is the card's NVML UUID, unique on the node.
	UUID string `json:"uuid"`
	// Model is the product name, e.g. "NVIDIA A100-SXM4-80GB".
	Model string `json:"model"`
	// MemoryMiB is the card's total memory.
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the card's compute, always FullCores (100) today.
	Cores int64 `json:"cores"`
	// NUMANode is the card's NUMA node, or -1 when unknown.
	NUMANode int `json:"numaNode"`
	// Healthy is false while the card must not get new work.
	Healthy bool `json:"healthy"`
	// MIGEnabled reports that the card is in MIG mode. Tessera does not
	// support MIG yet: the scheduler places no pod on such a card.
	MIGEnabled bool `json:"migEnabled,omitempty"`
}

// DecodeInventory parses and validates an inventory annotation. The cards of
// the result are sorted by index.
func DecodeInventory(raw string) (*Inventory, error) {
	var inv Inventory
	if err := decodeAnnotation(InventoryAnnotation, raw, &inv); err != nil {
		return nil, err
	}
	sort.Slice(inv.Cards, func(i, j int) bool { return inv.Cards[i].Index < inv.Cards[j].Index })
	return &inv, nil
}

// Encode returns the annotation value for the inventory.
func (inv *Inventory) Encode() (string, error) { return encodeAnnotation(inv) }

// Validate reports the first problem of the inventory, naming the field.
func (inv *Inventory) Validate() error {
	if inv.Version != InventoryVersion {
		return fmt.Errorf("%s: version: unsupported version %d, want %d", InventoryAnnotation, inv.Version, InventoryVersion)
	}
	if len(inv.Cards) > MaxCardsPerNode {
		return fmt.Errorf("%s: cards: %d cards is more than the %d allowed", InventoryAnnotation, len(inv.Cards), MaxCardsPerNode)
	}
	indices := make(map[int]bool, len(inv.Cards))
	uuids := make(map[string]bool, len(inv.Cards))
	for i := range inv.Cards {
		c := &inv.Cards[i]
		field := func(name string) string { return fmt.Sprintf("%s: cards[%d].%s", InventoryAnnotation, i, name) }
		switch {
		case c.Index < 0 || c.Index >= MaxCardsPerNode:
			return fmt.Errorf("%s: %d is outside 0-%d", field("index"), c.Index, MaxCardsPerNode-1)
		case indices[c.Index]:
			return fmt.Errorf("%s: index %d appears twice", field("index"), c.Index)
		case c.UUID == "" || len(c.UUID) > maxModelLength:
			return fmt.Errorf("%s: must be 1-%d characters", field("uuid"), maxModelLength)
		case uuids[c.UUID]:
			return fmt.Errorf("%s: %q appears twice", field("uuid"), c.UUID)
		case c.Model == "" || len(c.Model) > maxModelLength:
			return fmt.Errorf("%s: must be 1-%d characters", field("model"), maxModelLength)
		case c.MemoryMiB < 1 || c.MemoryMiB > MaxCardMemoryMiB:
			return fmt.Errorf("%s: %d is outside 1-%d MiB", field("memoryMiB"), c.MemoryMiB, MaxCardMemoryMiB)
		case c.Cores != FullCores:
			return fmt.Errorf("%s: must be %d, got %d", field("cores"), FullCores, c.Cores)
		case c.NUMANode < -1 || c.NUMANode > 1023:
			return fmt.Errorf("%s: %d is outside -1-1023", field("numaNode"), c.NUMANode)
		}
		indices[c.Index] = true
		uuids[c.UUID] = true
	}
	return nil
}
