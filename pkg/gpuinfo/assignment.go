package gpuinfo

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Assignment versions. An assignment that gives a container a MIG slice is
// version 2, so that an agent of an earlier release, which knows version 1
// only, refuses it rather than give the container the whole card.
const (
	// AssignmentVersion1 gives whole cards and shares of them.
	AssignmentVersion1 = 1
	// AssignmentVersion2 adds MIG slices (CardAssignment.MIG).
	AssignmentVersion2 = 2
	// AssignmentVersion is the newest version this package reads.
	AssignmentVersion = AssignmentVersion2
)

// Assignment is the content of a pod's AssignmentAnnotation: the cards chosen
// for each container that asked for GPUs.
type Assignment struct {
	Version    int                         `json:"version"`
	Containers map[string][]CardAssignment `json:"containers"`
}

// CardAssignment is one card given to one container.
type CardAssignment struct {
	// Index is the card's index on the node.
	Index int `json:"index"`
	// UUID is the card's UUID; it is what the node agent exposes.
	UUID string `json:"uuid"`
	// MemoryMiB is the container's memory limit on the card.
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the container's compute share of the card (of the slice,
	// with MIG), 0-100; 100 means the card (slice) is the container's alone.
	Cores int64 `json:"cores"`
	// MIG, when set, gives the container this MIG slice of the card rather
	// than the card (version 2).
	MIG *MIGSlice `json:"mig,omitempty"`
}

// MIGSlice names one MIG slice of a card by its profile and placement, which
// identify it on the card whether or not it exists yet.
type MIGSlice struct {
	// Profile is the slice's profile, e.g. "1g.10gb".
	Profile string `json:"profile"`
	// Start is the first memory slot of its placement.
	Start int `json:"start"`
	// UUID is the MIG device's UUID where the slice existed when it was
	// chosen; the agent gives the container that device only.
	UUID string `json:"uuid,omitempty"`
}

// SliceName names a MIG slice on its card: its profile and start slot,
// "3g.40gb@4".
func SliceName(profile string, start int) string { return profile + "@" + strconv.Itoa(start) }

// SliceKey is how the ledger names a card's MIG slice: the card's UUID and
// the slice's SliceName.
func SliceKey(cardUUID, profile string, start int) string {
	return cardUUID + "/" + SliceName(profile, start)
}

// Key is the name of what the entry charges in the ledger: the card's UUID,
// or its slice's SliceKey.
func (e *CardAssignment) Key() string {
	if e.MIG != nil {
		return SliceKey(e.UUID, e.MIG.Profile, e.MIG.Start)
	}
	return e.UUID
}

// NeededVersion is the oldest version that can express the assignment.
func (a *Assignment) NeededVersion() int {
	for _, cards := range a.Containers {
		for i := range cards {
			if cards[i].MIG != nil {
				return AssignmentVersion2
			}
		}
	}
	return AssignmentVersion1
}

// DecodeAssignment parses and validates an assignment annotation.
func DecodeAssignment(raw string) (*Assignment, error) {
	var a Assignment
	if err := decodeAnnotation(AssignmentAnnotation, raw, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Encode returns the annotation value for the assignment.
func (a *Assignment) Encode() (string, error) { return encodeAnnotation(a) }

// Validate reports the first problem of the assignment, naming the field.
func (a *Assignment) Validate() error {
	if a.Version < AssignmentVersion1 || a.Version > AssignmentVersion {
		return fmt.Errorf("%s: version: unsupported version %d, want 1-%d", AssignmentAnnotation, a.Version, AssignmentVersion)
	}
	if len(a.Containers) == 0 {
		return fmt.Errorf("%s: containers: must name at least one container", AssignmentAnnotation)
	}
	names := make([]string, 0, len(a.Containers))
	for name := range a.Containers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cards := a.Containers[name]
		field := func(i int, f string) string {
			return fmt.Sprintf("%s: containers[%q][%d].%s", AssignmentAnnotation, name, i, f)
		}
		if name == "" {
			return fmt.Errorf("%s: containers: empty container name", AssignmentAnnotation)
		}
		if len(cards) == 0 || len(cards) > MaxCardsPerNode {
			return fmt.Errorf("%s: containers[%q]: must list 1-%d cards, got %d", AssignmentAnnotation, name, MaxCardsPerNode, len(cards))
		}
		var seen [MaxCardsPerNode]bool
		for i := range cards {
			c := &cards[i]
			switch {
			case c.Index < 0 || c.Index >= MaxCardsPerNode:
				return fmt.Errorf("%s: %d is outside 0-%d", field(i, "index"), c.Index, MaxCardsPerNode-1)
			case seen[c.Index]:
				return fmt.Errorf("%s: card %d is listed twice", field(i, "index"), c.Index)
			case c.UUID == "" || len(c.UUID) > maxModelLength:
				return fmt.Errorf("%s: must be 1-%d characters", field(i, "uuid"), maxModelLength)
			case c.MemoryMiB < 1 || c.MemoryMiB > MaxCardMemoryMiB:
				return fmt.Errorf("%s: %d is outside 1-%d MiB", field(i, "memoryMiB"), c.MemoryMiB, MaxCardMemoryMiB)
			case c.Cores < 0 || c.Cores > FullCores:
				return fmt.Errorf("%s: %d is outside 0-%d", field(i, "cores"), c.Cores, FullCores)
			case c.MIG == nil:
			case a.Version < AssignmentVersion2:
				return fmt.Errorf("%s: needs assignment version %d", field(i, "mig"), AssignmentVersion2)
			case c.MIG.Profile == "" || len(c.MIG.Profile) > maxMIGProfileName || strings.ContainsAny(c.MIG.Profile, " ,/@"):
				return fmt.Errorf("%s: must be 1-%d characters without spaces, commas, slashes or @", field(i, "mig.profile"), maxMIGProfileName)
			case c.MIG.Start < 0 || c.MIG.Start >= MaxMIGSlots:
				return fmt.Errorf("%s: %d is outside 0-%d", field(i, "mig.start"), c.MIG.Start, MaxMIGSlots-1)
			case len(c.MIG.UUID) > maxModelLength:
				return fmt.Errorf("%s: longer than %d characters", field(i, "mig.uuid"), maxModelLength)
			}
			seen[c.Index] = true
		}
	}
	return nil
}
