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
	// Healthy is false for a card (or slice) that must get no new work.
	Healthy bool
	// MIG marks a card in MIG mode: its UUID gives a container no usable
	// device, so only its slices take pods. MIGDynamic marks one whose
	// slices are made as pods need them.
	MIG, MIGDynamic bool
	// Links is the node's link matrix, shared by its whole cards; nil when
	// the node reports none.
	Links *Links
	// Slice, when set, makes this entry one MIG slice of a card in MIG mode
	// (which precedes it): Index, Model and UUIDLower are the card's, UUID
	// is the slice's SliceKey and Capacity the slice's memory and the whole
	// of its compute. Only MIG requests use slices, and only slices serve
	// them.
	Slice *Slice
}

// Slice is what names a MIG slice on its card.
type Slice struct {
	// CardUUID is the UUID of the card in MIG mode.
	CardUUID string
	// Profile and Start are the slice's profile and first memory slot.
	Profile string
	Start   int
	// Slices is the profile's share of the card's compute, in slices.
	Slices int
	// Mask has a bit set for each memory slot the slice takes.
	Mask uint32
	// CardSlots is how many memory slots the card has.
	CardSlots int
	// DeviceUUID is the MIG device's UUID; "" for a slice of a dynamic
	// card that does not exist yet: the agent creates it for the pod
	// placed there.
	DeviceUUID string
}

// Name is the slice's gpuinfo.SliceName.
func (sl *Slice) Name() string { return gpuinfo.SliceName(sl.Profile, sl.Start) }

// Exists reports whether the slice is a MIG device now, rather than a
// placement the agent of a dynamic card would create.
func (sl *Slice) Exists() bool { return sl.DeviceUUID != "" }

// NewCards converts an inventory's cards: each card, followed by its MIG
// slices where it has any — on a dynamic card, also every placement of
// every profile that the existing slices leave room for.
func NewCards(inv *gpuinfo.Inventory) []Card {
	cards := make([]Card, 0, len(inv.Cards))
	links := NewLinks(inv)
	for _, c := range inv.Cards {
		cards = append(cards, NewCard(c))
		cards[len(cards)-1].Links = links
		cards = appendSlices(cards, c)
	}
	return cards
}

// appendSlices appends the MIG slices of card c.
func appendSlices(cards []Card, c gpuinfo.Card) []Card {
	if c.MIG == nil {
		return cards
	}
	var taken uint32
	for _, in := range c.MIG.Instances {
		p := c.MIG.Profile(in.Profile)
		cards = append(cards, sliceCard(c, p, in.Start, in.UUID, in.Healthy))
		taken |= slotMask(in.Start, p.Size)
	}
	if !c.MIG.Dynamic {
		return cards
	}
	for i := range c.MIG.Profiles {
		p := &c.MIG.Profiles[i]
		if !gpuinfo.CreatableProfile(p.Name) {
			continue
		}
		for _, start := range p.Starts {
			if slotMask(start, p.Size)&taken == 0 {
				cards = append(cards, sliceCard(c, p, start, "", true))
			}
		}
	}
	return cards
}

// sliceCard is the entry of a slice of profile p at start on card c.
func sliceCard(c gpuinfo.Card, p *gpuinfo.MIGProfile, start int, deviceUUID string, healthy bool) Card {
	return Card{
		Index:      c.Index,
		UUID:       gpuinfo.SliceKey(c.UUID, p.Name, start),
		Model:      c.Model,
		ModelLower: strings.ToLower(c.Model),
		UUIDLower:  strings.ToLower(c.UUID),
		Capacity:   Usage{MemoryMiB: p.MemoryMiB, Cores: gpuinfo.FullCores},
		Healthy:    c.Healthy && healthy,
		Slice: &Slice{
			CardUUID: c.UUID, Profile: p.Name, Start: start, Slices: p.Slices, Mask: slotMask(start, p.Size),
			CardSlots: c.MIG.Slots, DeviceUUID: deviceUUID,
		},
	}
}

// slotMask has the bits of slots start to start+size-1 set.
func slotMask(start, size int) uint32 { return (1<<size - 1) << start }

// OnlyPossible reports whether the entry is a slice of a dynamic card that
// does not exist and that nothing holds (used is what is held on it): a
// placement the scheduler may choose, not a device; tables and metrics
// leave it out.
func (c *Card) OnlyPossible(used Usage) bool {
	return c.Slice != nil && !c.Slice.Exists() && used == Usage{}
}

// TakesShares reports whether the entry is a whole card that may take new
// work: healthy, not in MIG mode, not a slice.
func (c *Card) TakesShares() bool { return c.Healthy && !c.MIG && c.Slice == nil }

// serves reports whether the entry may take new work of req: whole cards
// serve requests without MIG, slices (of the profile asked for, if any) MIG
// requests (wantsSlice, req.Isolation.MIG()).
func (c *Card) serves(req *gpuinfo.PodRequest, wantsSlice bool) bool {
	if !c.Healthy || c.MIG || (c.Slice != nil) != wantsSlice {
		return false
	}
	return c.Slice == nil || req.MIGProfile == "" || c.Slice.Profile == req.MIGProfile
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
		Healthy:    c.Healthy,
		MIG:        c.MIGEnabled,
		MIGDynamic: c.MIG != nil && c.MIG.Dynamic,
	}
}

// need returns what a container takes from a card: an exclusive container
// takes all of it, and ok is false when the card has less memory than it
// asks for.
func need(c *gpuinfo.ContainerRequest, card *Card) (nd Usage, ok bool) {
	if c.Exclusive() {
		return card.Capacity, c.MemoryMiB <= card.Capacity.MemoryMiB
	}
	return Usage{MemoryMiB: max(c.MemoryOn(card.Capacity.MemoryMiB), 1), Cores: c.Cores}, true
}

// entryCharge returns what an assignment entry holds on a card.
func entryCharge(e *gpuinfo.CardAssignment, card *Card) Usage {
	if e.Cores >= gpuinfo.FullCores {
		return card.Capacity
	}
	return Usage{MemoryMiB: e.MemoryMiB, Cores: e.Cores}
}
