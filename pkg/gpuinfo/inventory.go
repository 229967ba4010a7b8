package gpuinfo

import (
	"fmt"
	"sort"
)

// Inventory versions. A scheduler reads every version up to the newest it
// knows and refuses a newer one with a reason naming the version, so an agent
// writes InventoryVersion2 only once the schedulers reading it do
// (docs/install.md, the rollout order).
const (
	// InventoryVersion1 describes whole cards only.
	InventoryVersion1 = 1
	// InventoryVersion2 adds each card's MIG geometry (mig), the links
	// between the cards (links) and each card's PCIe root (pcieRoot).
	InventoryVersion2 = 2
	// InventoryVersion is the newest version this package reads.
	InventoryVersion = InventoryVersion2
)

// maxModelLength bounds a card's model name.
const maxModelLength = 256

// Inventory is the content of a node's InventoryAnnotation.
type Inventory struct {
	Version int    `json:"version"`
	Cards   []Card `json:"cards"`
	// Links is the class of the link between every pair of cards, one of
	// LinkLetters per pair, pairs in LinkPosition's order of the cards
	// sorted by index; "" when unknown (version 2 only).
	Links string `json:"links,omitempty"`
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
	// PCIeRoot is the PCIe root complex the card hangs off, "pci0000:00"
	// as sysfs names it (version 2 only); "" when unknown.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// Healthy is false while the card must not get new work.
	Healthy bool `json:"healthy"`
	// MIGEnabled reports that the card is in MIG mode. Only its MIG slices
	// (MIG, version 2) take pods; a card in MIG mode without them takes none.
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIG is the card's MIG geometry (version 2 only; set only with
	// MIGEnabled).
	MIG *MIG `json:"mig,omitempty"`
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
	switch {
	case inv.Version > InventoryVersion:
		return fmt.Errorf("%s: version: unsupported version %d, want 1-%d (written by a newer node agent: upgrade the scheduler, or run the agent with --inventory-version=%d)", InventoryAnnotation, inv.Version, InventoryVersion, InventoryVersion)
	case inv.Version < InventoryVersion1:
		return fmt.Errorf("%s: version: unsupported version %d, want 1-%d", InventoryAnnotation, inv.Version, InventoryVersion)
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
		case c.MIG != nil && inv.Version < InventoryVersion2:
			return fmt.Errorf("%s: needs inventory version %d", field("mig"), InventoryVersion2)
		case c.MIG != nil && !c.MIGEnabled:
			return fmt.Errorf("%s: set on a card whose migEnabled is false", field("mig"))
		}
		indices[c.Index] = true
		uuids[c.UUID] = true
		if c.MIG != nil {
			if err := c.MIG.validate(field("mig"), c.MemoryMiB, uuids); err != nil {
				return err
			}
		}
	}
	return inv.validateTopology()
}
