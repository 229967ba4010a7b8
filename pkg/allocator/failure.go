package allocator

import (
	"strconv"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// FailureKind says why a pod does not fit on a node.
type FailureKind uint8

const (
	// NoMatchingCard: no card of the node matches the pod's selectors.
	NoMatchingCard FailureKind = iota + 1
	// NoHealthyCard: cards match, but none of them is healthy.
	NoHealthyCard
	// NoCapacity: no card has room for a single-card container.
	NoCapacity
	// TooFewCards: a multi-card container found fewer cards with room than it needs.
	TooFewCards
	// InMIGMode: cards match and none is usable; some are in MIG mode,
	// whose slices serve MIG requests only.
	InMIGMode
	// NoMIGSlice: the pod asks for MIG and no matching card has a healthy
	// MIG slice.
	NoMIGSlice
	// Reserved: the pod would fit but for the cards reserved for other pods
	// (Strategy.Reserve).
	Reserved
	// NoLinkedSet: a multi-card container found enough cards with room,
	// but no set of them linked as the pod requires (Link).
	NoLinkedSet
	// NoTopology: the pod requires linked cards (Link) and the node reports
	// no links between its cards.
	NoTopology
)

// Failure details why a pod does not fit.
type Failure struct {
	Kind FailureKind
	// Container is the container that did not fit (NoCapacity, TooFewCards).
	Container *gpuinfo.ContainerRequest
	// Fit is how many cards the container did get.
	Fit int
	// MostFree is the most memory and compute any remaining eligible card
	// had free for the container.
	MostFree Usage
	// Reserved is how many cards were reserved (Reserved).
	Reserved int
	// InSlices reports that the container was placed among MIG slices.
	InSlices bool
	// Profile is the MIG profile the pod asked for (NoMIGSlice).
	Profile string
	// Link is the link class the pod requires (NoLinkedSet, NoTopology).
	Link gpuinfo.LinkClass
}

// Message describes the failure for an operator, e.g. "no GPU has 8192 MiB
// free". It depends on the pod and the kind of failure only, never on the
// node's figures, so that kube-scheduler, which counts identical reasons
// across nodes, reports one line per kind of failure however big the fleet
// is; the figures (how much the best card has free) are the summary's (see
// the GPUShare plugin's PostFilter). selector describes the pod's selector
// for NoMatchingCard.
func (f *Failure) Message(selector string) string {
	switch f.Kind {
	case NoMatchingCard:
		if selector == "" {
			return "node has no GPUs"
		}
		return "no GPU matches " + selector
	case NoHealthyCard:
		return "no healthy GPU"
	case InMIGMode:
		return "GPUs in MIG mode (ask for a slice with annotation " + gpuinfo.IsolationAnnotation + ")"
	case NoMIGSlice:
		if f.Profile != "" {
			return "no GPU in MIG mode with a healthy " + f.Profile + " slice"
		}
		return "no GPU in MIG mode with a healthy slice"
	case Reserved:
		return strconv.Itoa(f.Reserved) + " GPUs reserved for other pods"
	case NoTopology:
		return "node reports no GPU topology (" + gpuinfo.TopologyAnnotation + ": " + gpuinfo.TopologyName(f.Link) + ")"
	case NoLinkedSet:
		b := strconv.AppendInt([]byte("no "), int64(f.Container.Count), 10)
		return string(append(append(b, " free GPUs linked by "...), gpuinfo.TopologyName(f.Link)...))
	case TooFewCards:
		if f.Fit > 0 {
			b := strconv.AppendInt([]byte("fewer than "), int64(f.Container.Count), 10)
			return string(append(b, " GPUs have room"...))
		}
	}
	c := f.Container
	if c == nil {
		return "no GPU fits"
	}
	var b []byte
	switch {
	case f.InSlices && c.Exclusive() && c.MemoryMiB == 0:
		return "no MIG slice is free"
	case f.InSlices && c.Exclusive():
		b = strconv.AppendInt([]byte("no free MIG slice has "), c.MemoryMiB, 10)
		return string(append(b, " MiB"...))
	case f.InSlices:
		b = strconv.AppendInt([]byte("no MIG slice has "), c.MemoryMiB, 10)
		return string(append(b, " MiB free"...))
	case c.Exclusive():
		return "no GPU is entirely free"
	case c.MemoryMiB == 0:
		pct := c.MemoryPercent
		if pct == 0 {
			pct = 100
		}
		b = strconv.AppendInt([]byte("no GPU has "), pct, 10)
		b = append(b, "% of its memory and "...)
		b = strconv.AppendInt(b, c.Cores, 10)
		return string(append(b, "% compute free"...))
	case f.MostFree.MemoryMiB < c.MemoryMiB:
		b = strconv.AppendInt([]byte("no GPU has "), c.MemoryMiB, 10)
		b = append(b, " MiB free"...)
	case f.MostFree.Cores < c.Cores:
		b = strconv.AppendInt([]byte("no GPU has "), c.Cores, 10)
		b = append(b, "% compute free"...)
	default:
		b = strconv.AppendInt([]byte("no GPU has both "), c.MemoryMiB, 10)
		b = append(b, " MiB and "...)
		b = strconv.AppendInt(b, c.Cores, 10)
		b = append(b, "% compute free"...)
	}
	return string(b)
}
