package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// nvlinkDomains numbers the cards' NVLink domains by card index.
func nvlinkDomains(cards []discovery.Card) map[int]int {
	sorted := sortedByIndex(cards)
	link := func(i, j int) gpuinfo.LinkClass { return sorted[i].LinkTo(sorted[j].Index) }
	domains := map[int]int{}
	for i, d := range gpuinfo.NVLinkDomains(len(sorted), link) {
		if d > 0 {
			domains[sorted[i].Index] = d
		}
	}
	return domains
}

// addTopology adds the card's topology to a device's attributes (the
// card's, or one of its MIG slices'): the standard PCIe root and NUMA node,
// which other drivers' devices share (a NIC on the same root), Tessera's
// numaNode of before, and the NVLink domain.
func addTopology(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, c discovery.Card, domains map[int]int) {
	if c.NUMANode >= 0 {
		attrs["numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(c.NUMANode))}
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(c.NUMANode))}
	}
	if c.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(c.PCIeRoot)}
	}
	if d := domains[c.Index]; d > 0 {
		attrs[gpuinfo.DRANVLinkDomainAttribute] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d))}
	}
}
