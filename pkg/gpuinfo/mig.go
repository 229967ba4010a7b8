package gpuinfo

import (
	"fmt"
	"strings"
)

// Bounds on a card's MIG geometry.
const (
	// MaxMIGSlots bounds the memory slots a card's placements count in (8
	// on A100, H100, H200 and B200).
	MaxMIGSlots = 16
	// maxMIGProfiles bounds the profiles one card lists.
	maxMIGProfiles = 32
	// maxMIGProfileName bounds a profile's name, e.g. "1g.10gb+me".
	maxMIGProfileName = 32
	// maxInstanceID bounds NVML's GPU and compute instance IDs.
	maxInstanceID = 255
)

// MIG is a card's MIG geometry, as the node agent reads it through NVML: the
// GPU instance profiles the card offers, where each may be placed, and the
// instances it holds now.
type MIG struct {
	// Dynamic: Tessera creates and destroys the card's slices as pods need
	// them; the scheduler chooses profile and placement.
	Dynamic bool `json:"dynamic,omitempty"`
	// Slots is how many memory slots the card's placements count in.
	Slots int `json:"slots"`
	// Profiles are the GPU instance profiles the card offers.
	Profiles []MIGProfile `json:"profiles"`
	// Instances are the card's MIG devices now: GPU instances with a
	// compute instance spanning them.
	Instances []MIGInstance `json:"instances"`
}

// MIGProfile is one GPU instance profile, e.g. "3g.40gb".
type MIGProfile struct {
	// Name is NVIDIA's name for the profile: compute slices, "g.", memory
	// in GB, and "+me" for the variant with media extensions.
	Name string `json:"name"`
	// ID is NVML's GPU instance profile ID.
	ID int `json:"id"`
	// Slices is the profile's share of the card's compute, in slices (the
	// "3" of 3g.40gb).
	Slices int `json:"slices"`
	// Size is how many memory slots a placement of the profile takes.
	Size int `json:"size"`
	// MemoryMiB is the memory an instance of the profile offers.
	MemoryMiB int64 `json:"memoryMiB"`
	// Multiprocessors is the instance's streaming multiprocessor count.
	Multiprocessors int `json:"multiprocessors"`
	// Starts are the slots a placement of the profile may start at.
	Starts []int `json:"starts"`
}

// MIGInstance is one MIG device of a card.
type MIGInstance struct {
	// Profile names the instance's profile in the card's Profiles.
	Profile string `json:"profile"`
	// Start is the first memory slot the instance takes.
	Start int `json:"start"`
	// UUID is the MIG device's UUID ("MIG-..."), what a container is given.
	UUID string `json:"uuid"`
	// Index is the MIG device's index under its card (nvidia-smi's "MIG
	// dev"), by which the NVIDIA toolkit's CDI spec names it "CARD:INDEX".
	Index int `json:"index"`
	// GPUInstance and ComputeInstance are NVML's IDs of the slice's GPU
	// instance and compute instance, which name its capability device
	// nodes (/dev/nvidia-caps).
	GPUInstance     int `json:"gpuInstance"`
	ComputeInstance int `json:"computeInstance"`
	// Healthy is false while the instance must not get new work.
	Healthy bool `json:"healthy"`
}

// Profile returns the named profile, or nil.
func (m *MIG) Profile(name string) *MIGProfile {
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return &m.Profiles[i]
		}
	}
	return nil
}

// validate reports the first problem of a card's MIG geometry; cardMemoryMiB
// bounds a profile's memory and uuids holds the node's UUIDs so far.
func (m *MIG) validate(path string, cardMemoryMiB int64, uuids map[string]bool) error {
	if m.Slots < 1 || m.Slots > MaxMIGSlots {
		return fmt.Errorf("%s.slots: %d is outside 1-%d", path, m.Slots, MaxMIGSlots)
	}
	if len(m.Profiles) > maxMIGProfiles {
		return fmt.Errorf("%s.profiles: %d profiles is more than the %d allowed", path, len(m.Profiles), maxMIGProfiles)
	}
	names := make(map[string]bool, len(m.Profiles))
	for i := range m.Profiles {
		p := &m.Profiles[i]
		field := func(name string) string { return fmt.Sprintf("%s.profiles[%d].%s", path, i, name) }
		switch {
		case p.Name == "" || len(p.Name) > maxMIGProfileName || strings.ContainsAny(p.Name, " ,/@"):
			return fmt.Errorf("%s: must be 1-%d characters without spaces, commas, slashes or @", field("name"), maxMIGProfileName)
		case names[p.Name]:
			return fmt.Errorf("%s: %q appears twice", field("name"), p.Name)
		case p.ID < 0 || p.ID > 255:
			return fmt.Errorf("%s: %d is outside 0-255", field("id"), p.ID)
		case p.Slices < 1 || p.Slices > m.Slots:
			return fmt.Errorf("%s: %d is outside 1-%d", field("slices"), p.Slices, m.Slots)
		case p.Size < 1 || p.Size > m.Slots:
			return fmt.Errorf("%s: %d is outside 1-%d", field("size"), p.Size, m.Slots)
		case p.MemoryMiB < 1 || p.MemoryMiB > cardMemoryMiB:
			return fmt.Errorf("%s: %d is outside 1-%d MiB (the card's memory)", field("memoryMiB"), p.MemoryMiB, cardMemoryMiB)
		case p.Multiprocessors < 0 || p.Multiprocessors > 1<<16:
			return fmt.Errorf("%s: %d is outside 0-%d", field("multiprocessors"), p.Multiprocessors, 1<<16)
		case len(p.Starts) > m.Slots:
			return fmt.Errorf("%s: %d starts is more than the card's %d slots", field("starts"), len(p.Starts), m.Slots)
		}
		for j, start := range p.Starts {
			if start < 0 || start+p.Size > m.Slots {
				return fmt.Errorf("%s[%d]: %d is outside 0-%d", field("starts"), j, start, m.Slots-p.Size)
			}
		}
		names[p.Name] = true
	}
	if len(m.Instances) > m.Slots {
		return fmt.Errorf("%s.instances: %d instances is more than the card's %d slots", path, len(m.Instances), m.Slots)
	}
	var taken, indices [MaxMIGSlots]bool
	for i := range m.Instances {
		in := &m.Instances[i]
		field := func(name string) string { return fmt.Sprintf("%s.instances[%d].%s", path, i, name) }
		p := m.Profile(in.Profile)
		switch {
		case p == nil:
			return fmt.Errorf("%s: %q is not one of the card's profiles", field("profile"), in.Profile)
		case !p.startsAt(in.Start):
			return fmt.Errorf("%s: profile %s cannot start at slot %d", field("start"), p.Name, in.Start)
		case in.UUID == "" || len(in.UUID) > maxModelLength:
			return fmt.Errorf("%s: must be 1-%d characters", field("uuid"), maxModelLength)
		case uuids[in.UUID]:
			return fmt.Errorf("%s: %q appears twice on the node", field("uuid"), in.UUID)
		case in.Index < 0 || in.Index >= m.Slots:
			return fmt.Errorf("%s: %d is outside 0-%d", field("index"), in.Index, m.Slots-1)
		case indices[in.Index]:
			return fmt.Errorf("%s: %d appears twice on the card", field("index"), in.Index)
		case in.GPUInstance < 0 || in.GPUInstance > maxInstanceID:
			return fmt.Errorf("%s: %d is outside 0-%d", field("gpuInstance"), in.GPUInstance, maxInstanceID)
		case in.ComputeInstance < 0 || in.ComputeInstance > maxInstanceID:
			return fmt.Errorf("%s: %d is outside 0-%d", field("computeInstance"), in.ComputeInstance, maxInstanceID)
		}
		indices[in.Index] = true
		for s := in.Start; s < in.Start+p.Size; s++ {
			if taken[s] {
				return fmt.Errorf("%s: slot %d is taken by another instance", field("start"), s)
			}
			taken[s] = true
		}
		uuids[in.UUID] = true
	}
	return nil
}

func (p *MIGProfile) startsAt(slot int) bool {
	for _, s := range p.Starts {
		if s == slot {
			return true
		}
	}
	return false
}
