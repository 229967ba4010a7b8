// Package discovery finds a node's GPUs. Two backends share one interface:
// NVML (the production path, through go-nvml) and a simulated fleet described
// by a flag, used by tests, the integration suite and the demo, so that every
// layer above the backend runs the same code in all three.
package discovery

import (
	"context"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Card is one GPU as a backend reports it.
type Card struct {
	Index     int
	UUID      string
	Model     string
	MemoryMiB int64
	// NUMANode is -1 when unknown.
	NUMANode int
	// MIGEnabled reports the card's current MIG mode; MIG partitioning is not
	// managed by Tessera.
	MIGEnabled bool
	Healthy    bool
}

// Backend lists the node's cards.
type Backend interface {
	// Name describes the backend for logs, e.g. "nvml (driver 550.54.15)".
	Name() string
	// Cards returns the cards present now, by index.
	Cards() ([]Card, error)
	// Close releases the backend.
	Close() error
}

// XIDWatcher is a backend that can report XID errors as they happen.
type XIDWatcher interface {
	WatchXIDs(ctx context.Context, report func(uuid string, xid uint64)) error
}

// Inventory converts cards into the inventory annotation's content.
func Inventory(cards []Card) *gpuinfo.Inventory {
	inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion, Cards: []gpuinfo.Card{}}
	for _, c := range cards {
		inv.Cards = append(inv.Cards, gpuinfo.Card{
			Index: c.Index, UUID: c.UUID, Model: c.Model, MemoryMiB: c.MemoryMiB,
			Cores: gpuinfo.FullCores, NUMANode: c.NUMANode, Healthy: c.Healthy, MIGEnabled: c.MIGEnabled,
		})
	}
	return inv
}
