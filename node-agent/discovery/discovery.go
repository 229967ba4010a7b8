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
	Index int
	// Minor is the card's device-node minor number (/dev/nvidia<Minor>,
	// character major 195), which is not always its index; -1 when unknown.
	Minor     int
	UUID      string
	Model     string
	MemoryMiB int64
	// NUMANode is -1 when unknown.
	NUMANode int
	// PCIeRoot is the card's PCIe root complex as sysfs names it,
	// "pci0000:00"; "" when unknown.
	PCIeRoot string
	// Links is the class of the card's link to each card of the node, by
	// that card's index; nil when unknown.
	Links []gpuinfo.LinkClass
	// MIGEnabled reports the card's current MIG mode.
	MIGEnabled bool
	// MIG is the card's MIG geometry when it is in MIG mode and the backend
	// could read it; nil otherwise (then the card takes no pods).
	MIG *gpuinfo.MIG
	// MIGDynamic: the operator lets Tessera create and destroy this card's
	// MIG slices (the agent's --dynamic-mig-cards).
	MIGDynamic bool
	Healthy    bool
}

// Slice returns the card's MIG instance of the given profile at start, and
// its profile; nil when it has none.
func (c *Card) Slice(profile string, start int) (*gpuinfo.MIGInstance, *gpuinfo.MIGProfile) {
	if c.MIG == nil {
		return nil, nil
	}
	for i := range c.MIG.Instances {
		if in := &c.MIG.Instances[i]; in.Profile == profile && in.Start == start {
			return in, c.MIG.Profile(profile)
		}
	}
	return nil, nil
}

// LinkTo is the class of the card's link to the card of index peer;
// LinkUnknown when not measured.
func (c *Card) LinkTo(peer int) gpuinfo.LinkClass {
	if peer >= 0 && peer < len(c.Links) {
		return c.Links[peer]
	}
	return gpuinfo.LinkUnknown
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

// MIGController is a backend that can create and destroy MIG slices on its
// cards in MIG mode. It never changes a card's MIG mode.
type MIGController interface {
	// CreateMIGSlice creates, on card index, a GPU instance of the named
	// profile at start slot and a compute instance spanning it, and returns
	// the new MIG device's UUID. It fails when the card is not in MIG mode,
	// has no such profile, the profile cannot start there, or the slots are
	// taken.
	CreateMIGSlice(index int, profile string, start int) (uuid string, err error)
	// DestroyMIGSlice destroys the slice of the named profile at start on
	// card index: its compute instances, then its GPU instance. A slice that
	// does not exist is not an error, also on a card not in MIG mode or
	// without that profile.
	DestroyMIGSlice(index int, profile string, start int) error
}

// XIDWatcher is a backend that can report XID errors as they happen.
type XIDWatcher interface {
	WatchXIDs(ctx context.Context, report func(uuid string, xid uint64)) error
}

// Inventory converts cards (by index) into the inventory annotation's
// content, in the oldest version that describes them, newest at most:
// version 2 where a card in MIG mode has its geometry (its slices take pods)
// or the links between several cards are known (multi-card pods get the best
// linked cards), else version 1, which schedulers of every release read. With
// newest 1 the geometry and the links are left out: cards in MIG mode then
// take no pods, and multi-card pods get cards by usage alone. A dynamic
// card's geometry is a copy marked Dynamic. Version 2 also carries each
// card's PCIe root.
func Inventory(cards []Card, newest int) *gpuinfo.Inventory {
	inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion1, Cards: []gpuinfo.Card{}}
	if newest >= gpuinfo.InventoryVersion2 {
		inv.Links = links(cards)
	}
	if inv.Links != "" {
		inv.Version = gpuinfo.InventoryVersion2
	}
	for _, c := range cards {
		card := gpuinfo.Card{
			Index: c.Index, UUID: c.UUID, Model: c.Model, MemoryMiB: c.MemoryMiB,
			Cores: gpuinfo.FullCores, NUMANode: c.NUMANode, Healthy: c.Healthy, MIGEnabled: c.MIGEnabled,
		}
		if newest >= gpuinfo.InventoryVersion2 && c.MIGEnabled && c.MIG != nil {
			card.MIG = publishedMIG(c)
			inv.Version = gpuinfo.InventoryVersion2
		}
		inv.Cards = append(inv.Cards, card)
	}
	if inv.Version >= gpuinfo.InventoryVersion2 {
		for i := range inv.Cards {
			inv.Cards[i].PCIeRoot = cards[i].PCIeRoot
		}
	}
	return inv
}

// links encodes the links between the cards; "" when there are fewer than
// two or none is known.
func links(cards []Card) string {
	known := false
	link := func(i, j int) gpuinfo.LinkClass { return cards[i].LinkTo(cards[j].Index) }
	for i := range cards {
		for j := i + 1; j < len(cards) && !known; j++ {
			known = link(i, j) != gpuinfo.LinkUnknown
		}
	}
	if !known {
		return ""
	}
	return gpuinfo.EncodeLinks(len(cards), link)
}

// publishedMIG is card c's MIG geometry as the inventory publishes it: a
// copy, dynamic when the card is; nil when c has none.
func publishedMIG(c Card) *gpuinfo.MIG {
	if c.MIG == nil {
		return nil
	}
	m := *c.MIG
	m.Dynamic = c.MIGDynamic
	return &m
}

// CardStats is a card's live reading, for metrics.
type CardStats struct {
	Index int
	UUID  string
	// MemoryUsedMiB, Utilization (0-1) and TemperatureC are -1 when the
	// backend could not read them.
	MemoryUsedMiB int64
	Utilization   float64
	TemperatureC  float64
	// Processes are the processes using the card; nil when they could not
	// be read (ProcessesKnown false).
	Processes      []Process
	ProcessesKnown bool
}

// Process is one process using a card.
type Process struct {
	// PID is the process's ID as the backend reports it (NVML: the host's);
	// 0 when the backend names the container itself.
	PID uint32
	// ContainerID is set by backends that know the process's container (the
	// simulated one): the runtime's container ID, without its "containerd://"
	// prefix. Otherwise the container is found from the PID's cgroup.
	ContainerID   string
	MemoryUsedMiB int64
}

// StatsReader is a backend that can read its cards' live statistics. Stats
// returns what it could read and, joined, the errors of what it could not.
type StatsReader interface {
	Stats() ([]CardStats, error)
}
