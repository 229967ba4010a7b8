package gpuinfo

import (
	"fmt"
	"strings"
)

// LinkClass is how directly two cards of a node talk, as NVML's topology
// reports it; a higher class is faster. The inventory writes each class as
// one letter (LinkLetters), after nvidia-smi topo -m's legend.
type LinkClass uint8

const (
	// LinkUnknown: the agent could not read the pair's relation.
	LinkUnknown LinkClass = iota
	// LinkSystem (SYS): across CPU sockets, over the SMP interconnect.
	LinkSystem
	// LinkNUMANode (NODE): within one NUMA node, between its PCIe host
	// bridges.
	LinkNUMANode
	// LinkHostBridge (PHB): through one PCIe host bridge, the CPU's.
	LinkHostBridge
	// LinkPCIeBridges (PXB): through several PCIe switches, not the host
	// bridge.
	LinkPCIeBridges
	// LinkPCIeSwitch (PIX): through one PCIe switch, or on one board.
	LinkPCIeSwitch
	// LinkNVLink (NV): NVLink, directly or through NVSwitch.
	LinkNVLink
	// NumLinkClasses counts the classes.
	NumLinkClasses
)

// LinkLetters are the inventory's letters for the link classes, by class.
const LinkLetters = "?SNHBPV"

// linkNames are the classes' names in nvidia-smi topo -m's legend, by class.
var linkNames = [NumLinkClasses]string{"unknown", "SYS", "NODE", "PHB", "PXB", "PIX", "NVLink"}

// String is the class's name in nvidia-smi topo -m's legend.
func (l LinkClass) String() string {
	if l >= NumLinkClasses {
		return "invalid"
	}
	return linkNames[l]
}

// LinkPairs is how many pairs n cards make: the length of an inventory's
// links.
func LinkPairs(n int) int { return n * (n - 1) / 2 }

// LinkPosition is the position in an inventory's links of the pair of the
// cards at positions i and j (i != j) of its index-sorted cards, n cards in
// all: pairs (0,1), (0,2) … (0,n-1), (1,2) … in that order.
func LinkPosition(i, j, n int) int {
	if i > j {
		i, j = j, i
	}
	return i*(2*n-i-1)/2 + j - i - 1
}

// Link returns the class of the link between the cards at positions i and j
// of the inventory's index-sorted cards; LinkUnknown when the inventory has
// no links.
func (inv *Inventory) Link(i, j int) LinkClass {
	if inv.Links == "" || i == j {
		return LinkUnknown
	}
	return LinkClass(strings.IndexByte(LinkLetters, inv.Links[LinkPosition(i, j, len(inv.Cards))]))
}

// EncodeLinks writes the links of n cards, link(i, j) giving the class of the
// cards at positions i < j.
func EncodeLinks(n int, link func(i, j int) LinkClass) string {
	b := make([]byte, 0, LinkPairs(n))
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			b = append(b, LinkLetters[min(link(i, j), NumLinkClasses-1)])
		}
	}
	return string(b)
}

// NVLinkDomains numbers the cards (by position) that NVLink joins, directly
// or through other cards or NVSwitch, from 1 in order of their first card; 0
// for a card without NVLink. link(i, j) gives the class of the cards at
// positions i < j.
func NVLinkDomains(n int, link func(i, j int) LinkClass) []int {
	domains := make([]int, n)
	next := 0
	for i := 0; i < n; i++ {
		if domains[i] != 0 {
			continue
		}
		found := false
		stack := []int{i}
		for len(stack) > 0 {
			a := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for b := 0; b < n; b++ {
				if b != a && domains[b] == 0 && link(min(a, b), max(a, b)) == LinkNVLink {
					if !found {
						next++
						found = true
						domains[i] = next
					}
					domains[b] = next
					stack = append(stack, b)
				}
			}
		}
	}
	return domains
}

// validateTopology checks the inventory's links and its cards' PCIe roots.
func (inv *Inventory) validateTopology() error {
	if inv.Links != "" {
		if inv.Version < InventoryVersion2 {
			return fmt.Errorf("%s: links: needs inventory version %d", InventoryAnnotation, InventoryVersion2)
		}
		if want := LinkPairs(len(inv.Cards)); len(inv.Links) != want {
			return fmt.Errorf("%s: links: %d letters for %d cards, want one per pair of cards (%d)", InventoryAnnotation, len(inv.Links), len(inv.Cards), want)
		}
		if i := strings.IndexFunc(inv.Links, func(r rune) bool { return !strings.ContainsRune(LinkLetters, r) }); i >= 0 {
			return fmt.Errorf("%s: links: letter %d is %q, want one of %q", InventoryAnnotation, i, inv.Links[i], LinkLetters)
		}
	}
	for i := range inv.Cards {
		root := inv.Cards[i].PCIeRoot
		switch {
		case root == "":
		case inv.Version < InventoryVersion2:
			return fmt.Errorf("%s: cards[%d].pcieRoot: needs inventory version %d", InventoryAnnotation, i, InventoryVersion2)
		case !validPCIeRoot(root):
			return fmt.Errorf("%s: cards[%d].pcieRoot: %q is not a PCIe root such as pci0000:00", InventoryAnnotation, i, truncated(root))
		}
	}
	return nil
}

// validPCIeRoot reports whether root reads "pci" then a PCI domain and bus
// in hexadecimal, "pci0000:00", as Linux names a root complex in sysfs and
// DRA's resource.kubernetes.io/pcieRoot attribute holds it.
func validPCIeRoot(root string) bool {
	domain, bus, ok := strings.Cut(strings.TrimPrefix(root, "pci"), ":")
	return ok && strings.HasPrefix(root, "pci") && isHex(domain, 4, 8) && isHex(bus, 2, 2)
}

// isHex reports whether s is lowercase hexadecimal of minLen to maxLen digits.
func isHex(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for _, r := range s {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
			return false
		}
	}
	return true
}

// TopologyAnnotation requires the cards of each of a pod's multi-card
// containers to be linked at least as closely as it names (TopologyValues);
// without it, or with "any", the best linked set that is free is preferred.
const TopologyAnnotation = Domain + "/gpu-topology"

// TopologyValues are the values of TopologyAnnotation and the link class each
// requires between every two cards of a container.
var TopologyValues = map[string]LinkClass{
	"nvlink":      LinkNVLink,
	"pcie-switch": LinkPCIeBridges,
	"numa-node":   LinkNUMANode,
	"any":         LinkUnknown,
}

// topologyNames are TopologyValues' names, for messages.
const topologyNames = `"nvlink", "pcie-switch", "numa-node" or "any"`

// parseTopology reads the pod's TopologyAnnotation: the link class required,
// LinkUnknown when none is.
func parseTopology(annotations map[string]string) (LinkClass, error) {
	v, ok := annotations[TopologyAnnotation]
	if !ok {
		return LinkUnknown, nil
	}
	if class, ok := TopologyValues[v]; ok {
		return class, nil
	}
	return LinkUnknown, fmt.Errorf("annotation %s: must be %s, got %q", TopologyAnnotation, topologyNames, truncated(v))
}

// TopologyName is the TopologyAnnotation value that requires class.
func TopologyName(class LinkClass) string {
	for name, c := range TopologyValues {
		if c == class {
			return name
		}
	}
	return class.String()
}
