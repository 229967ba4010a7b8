// Package topology describes the card topologies of common GPU servers, for
// the simulated node agent, the trace simulator, the demo and tests: which
// link joins each pair of a node's cards, and each card's NUMA node.
package topology

import (
	"fmt"
	"slices"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Shapes of nodes.
const (
	// NVSwitch: every card on one NVSwitch fabric (HGX A100/H100), half the
	// cards on each CPU socket.
	NVSwitch = "nvswitch"
	// NVLinkQuads: groups of four cards joined by NVLink, each group behind
	// one CPU socket, PCIe across the sockets between the groups.
	NVLinkQuads = "nvlink-quads"
	// PCIeSockets: PCIe cards in pairs behind one switch, half the pairs on
	// each CPU socket.
	PCIeSockets = "pcie-sockets"
)

// Shapes lists the shapes.
var Shapes = []string{NVSwitch, NVLinkQuads, PCIeSockets}

// Valid reports whether shape is one of Shapes.
func Valid(shape string) bool { return slices.Contains(Shapes, shape) }

// Link is the link between cards i and j (i != j) of a node of n cards of the
// shape.
func Link(shape string, n, i, j int) gpuinfo.LinkClass {
	sameSocket := Socket(shape, n, i) == Socket(shape, n, j)
	switch {
	case shape == NVSwitch:
		return gpuinfo.LinkNVLink
	case shape == NVLinkQuads && i/4 == j/4:
		return gpuinfo.LinkNVLink
	case shape == PCIeSockets && i/2 == j/2:
		return gpuinfo.LinkPCIeSwitch
	case sameSocket:
		return gpuinfo.LinkNUMANode
	}
	return gpuinfo.LinkSystem
}

// Socket is the CPU socket (and NUMA node) of card i of a node of n cards of
// the shape.
func Socket(shape string, n, i int) int {
	if shape == NVLinkQuads {
		return i / 4
	}
	return i * 2 / max(n, 1)
}

// PCIeRoot is the PCIe root complex of card i: one per socket.
func PCIeRoot(shape string, n, i int) string {
	return fmt.Sprintf("pci%04x:%02x", 0, Socket(shape, n, i)*0x80)
}

// Apply gives the inventory's cards the shape's links, NUMA nodes and PCIe
// roots, and makes it version 2.
func Apply(inv *gpuinfo.Inventory, shape string) {
	n := len(inv.Cards)
	for i := range inv.Cards {
		inv.Cards[i].NUMANode = Socket(shape, n, i)
		inv.Cards[i].PCIeRoot = PCIeRoot(shape, n, i)
	}
	inv.Links = gpuinfo.EncodeLinks(n, func(i, j int) gpuinfo.LinkClass { return Link(shape, n, i, j) })
	inv.Version = gpuinfo.InventoryVersion2
}
