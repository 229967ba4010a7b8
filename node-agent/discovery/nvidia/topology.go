package nvidia

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// topology is a measurement of the links between a node's cards, kept while
// the cards stay the same: their topology does not change.
type topology struct {
	// uuids are the measured cards' UUIDs, by index: the measurement holds
	// while the cards NVML reports have these.
	uuids []string
	// links are the measured cards' Links, by index.
	links [][]gpuinfo.LinkClass
}

// pcieLinkClasses are the link classes of the closest PCIe ancestors
// GetTopologyCommonAncestor reports; a level missing here is LinkUnknown.
var pcieLinkClasses = map[nvml.GpuTopologyLevel]gpuinfo.LinkClass{
	nvml.TOPOLOGY_INTERNAL:   gpuinfo.LinkPCIeSwitch,
	nvml.TOPOLOGY_SINGLE:     gpuinfo.LinkPCIeSwitch,
	nvml.TOPOLOGY_MULTIPLE:   gpuinfo.LinkPCIeBridges,
	nvml.TOPOLOGY_HOSTBRIDGE: gpuinfo.LinkHostBridge,
	nvml.TOPOLOGY_NODE:       gpuinfo.LinkNUMANode,
	nvml.TOPOLOGY_SYSTEM:     gpuinfo.LinkSystem,
}

// pcieRootName matches a PCIe root complex as sysfs names it: "pci", the PCI
// domain (4 to 8 hexadecimal digits), ":", the bus, e.g. "pci0000:00".
var pcieRootName = regexp.MustCompile(`^pci[0-9a-f]{4,8}:[0-9a-f]{2}$`)

// pcieRoot returns the PCIe root complex of the card at busID, read from the
// path its sysfs link resolves to
// (../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0); "" when unknown.
func (n *NVML) pcieRoot(busID string) string {
	if busID == "" {
		return ""
	}
	path, err := filepath.EvalSymlinks(filepath.Join(n.sysfsPCI, busID))
	if err != nil {
		return ""
	}
	for _, part := range strings.Split(filepath.ToSlash(path), "/") {
		if pcieRootName.MatchString(part) {
			return part
		}
	}
	return ""
}

// links returns the Links of the cards, by index; answered tells, by index,
// which cards were read in this scan (its length is NVML's card count), cards
// are those reported. The last measurement kept is returned while the cards'
// UUIDs are those it was taken with; otherwise the links are measured again,
// and kept when every card answered.
func (n *NVML) links(cards []discovery.Card, answered []bool) [][]gpuinfo.LinkClass {
	uuids := make([]string, len(answered))
	for _, c := range cards {
		uuids[c.Index] = c.UUID
	}
	if slices.Equal(uuids, n.topology.uuids) {
		return n.topology.links
	}
	links := n.measureLinks(answered)
	if !slices.Contains(answered, false) {
		n.topology = topology{uuids: uuids, links: links}
	}
	return links
}

// measureLinks measures the link between every two cards, by index; the
// links of a card that did not answer in this scan, or whose handle NVML
// cannot give, are unknown. Cards whose NVLinks lead to NVSwitch share one
// NVLink domain; other pairs are as NVML's P2P and PCIe topology queries
// report them.
func (n *NVML) measureLinks(answered []bool) [][]gpuinfo.LinkClass {
	count := len(answered)
	devices := make([]nvml.Device, count)
	switched := make([]bool, count)
	for i := range count {
		if !answered[i] {
			continue
		}
		if dev, ret := n.lib.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			devices[i], switched[i] = dev, onNVSwitch(dev)
		}
	}
	links := make([][]gpuinfo.LinkClass, count)
	for i := range links {
		links[i] = make([]gpuinfo.LinkClass, count)
	}
	for i := range count {
		for j := i + 1; j < count; j++ {
			if devices[i] == nil || devices[j] == nil {
				continue
			}
			class := gpuinfo.LinkNVLink
			if !switched[i] || !switched[j] {
				class = linkClass(devices[i], devices[j])
			}
			links[i][j], links[j][i] = class, class
		}
	}
	return links
}

// onNVSwitch reports whether one of the card's active NVLinks leads to an
// NVSwitch, as on HGX systems; a link NVML cannot describe is not counted.
func onNVSwitch(dev nvml.Device) bool {
	for link := range nvml.NVLINK_MAX_LINKS {
		if state, ret := dev.GetNvLinkState(link); ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		if remote, ret := dev.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS && remote == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			return true
		}
	}
	return false
}

// linkClass returns how cards a and b are linked: NVLink when NVML reports
// them NVLink peers, else through their closest common PCIe ancestor;
// LinkUnknown when NVML cannot tell.
func linkClass(a, b nvml.Device) gpuinfo.LinkClass {
	if status, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && status == nvml.P2P_STATUS_OK {
		return gpuinfo.LinkNVLink
	}
	ancestor, ret := a.GetTopologyCommonAncestor(b)
	if ret != nvml.SUCCESS {
		return gpuinfo.LinkUnknown
	}
	return pcieLinkClasses[ancestor]
}
