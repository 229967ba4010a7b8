package gpuinfo

import (
	"fmt"
	"sort"
)

// AssignmentVersion is the version of the assignment format this package
// writes and reads.
const AssignmentVersion = 1

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
	// Cores is the container's compute share of the card, 0-100; 100 means
	// the card is the container's alone.
	Cores int64 `json:"cores"`
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
	if a.Version != AssignmentVersion {
		return fmt.Errorf("%s: version: unsupported version %d, want %d", AssignmentAnnotation, a.Version, AssignmentVersion)
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
			}
			seen[c.Index] = true
		}
	}
	return nil
}
