package gpuinfo

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// GPU shares as DRA claims: the names the node agent's DRA driver publishes
// and the scheduler reads.
const (
	// DRADriver is the DRA driver name of Tessera's cards; it is also the
	// domain of their attributes and capacities.
	DRADriver = Domain
	// DRAMemory is a card's memory capacity (a quantity of bytes, whole MiB).
	DRAMemory = "memory"
	// DRACores is a card's compute capacity, in percent: 100 a card.
	DRACores = "cores"
	// DRAUnhealthyTaint is the key of the NoSchedule taint on a card out of
	// service.
	DRAUnhealthyTaint = Domain + "/unhealthy"
	// draDevicePrefix starts the device name of card i: "gpu-i".
	draDevicePrefix = "gpu-"
)

// DRADeviceName is the ResourceSlice device name of the card with index i.
func DRADeviceName(i int) string { return draDevicePrefix + strconv.Itoa(i) }

// DRACardIndex is the card index a device name names, and whether it names
// one.
func DRACardIndex(device string) (int, bool) {
	rest, ok := strings.CutPrefix(device, draDevicePrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0 && i < MaxCardsPerNode && DRADeviceName(i) == device
}

// MiB is the number of MiB in q bytes, rounded up.
func MiB(q resource.Quantity) int64 {
	const mib = 1 << 20
	return (q.Value() + mib - 1) / mib
}

// Sharing says how a claim's cards are handed over.
type Sharing string

const (
	// SharingLimited cards are limited to the claim's share of memory and
	// compute by the interception library.
	SharingLimited Sharing = "Limited"
	// SharingWhole cards are the claim's alone: the allocation must consume
	// all of each card, and no interception is loaded.
	SharingWhole Sharing = "Whole"
)

// DRAParameters are the opaque parameters a DeviceClass or a claim gives
// Tessera's driver (DeviceConfiguration.Opaque with driver DRADriver).
type DRAParameters struct {
	// APIVersion is DRAParametersAPIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is DRAParametersKind.
	Kind string `json:"kind"`
	// Sharing is SharingLimited when empty.
	Sharing Sharing `json:"sharing,omitempty"`
	// TaskPriority is the claim's containers' task priority on a shared
	// card; TaskPriorityLow when empty.
	TaskPriority TaskPriority `json:"taskPriority,omitempty"`
}

// The type of DRAParameters.
const (
	DRAParametersAPIVersion = Domain + "/v1alpha1"
	DRAParametersKind       = "GPUConfig"
)

// DecodeDRAParameters parses and validates opaque driver parameters.
func DecodeDRAParameters(raw []byte) (*DRAParameters, error) {
	var p DRAParameters
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("parameters of driver %s: %w", DRADriver, err)
	}
	switch {
	case p.APIVersion != DRAParametersAPIVersion || p.Kind != DRAParametersKind:
		return nil, fmt.Errorf("parameters of driver %s: apiVersion and kind must be %s and %s, got %q and %q", DRADriver, DRAParametersAPIVersion, DRAParametersKind, p.APIVersion, p.Kind)
	case p.Sharing != "" && p.Sharing != SharingLimited && p.Sharing != SharingWhole:
		return nil, fmt.Errorf("parameters of driver %s: sharing must be %s or %s, got %q", DRADriver, SharingLimited, SharingWhole, p.Sharing)
	case p.TaskPriority != "" && p.TaskPriority != TaskPriorityHigh && p.TaskPriority != TaskPriorityLow:
		return nil, fmt.Errorf("parameters of driver %s: taskPriority must be %s or %s, got %q", DRADriver, TaskPriorityHigh, TaskPriorityLow, p.TaskPriority)
	}
	return &p, nil
}

// DRACard reads a card from its ResourceSlice device, as the node agent's
// driver publishes it; false for a device that is not one of its cards. A
// card tainted NoSchedule or NoExecute is not Healthy.
func DRACard(d *resourceapi.Device) (Card, bool) {
	index, ok := DRACardIndex(d.Name)
	memory, hasMemory := d.Capacity[DRAMemory]
	cores, hasCores := d.Capacity[DRACores]
	if !ok || !hasMemory || !hasCores {
		return Card{}, false
	}
	card := Card{Index: index, MemoryMiB: MiB(memory.Value), Cores: cores.Value.Value(), Healthy: true, NUMANode: -1}
	if a := d.Attributes[DRANUMANodeAttribute]; a.IntValue != nil && *a.IntValue >= 0 && *a.IntValue <= 1023 {
		card.NUMANode = int(*a.IntValue)
	}
	if a := d.Attributes[DRAPCIeRootAttribute]; a.StringValue != nil && validPCIeRoot(*a.StringValue) {
		card.PCIeRoot = *a.StringValue
	}
	if a := d.Attributes["uuid"]; a.StringValue != nil {
		card.UUID = *a.StringValue
	}
	if a := d.Attributes["model"]; a.StringValue != nil {
		card.Model = *a.StringValue
	}
	if a := d.Attributes["migEnabled"]; a.BoolValue != nil {
		card.MIGEnabled = *a.BoolValue
	}
	for _, t := range d.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			card.Healthy = false
		}
	}
	return card, true
}

// DRAShare is what an allocation result consumes of card: its consumed
// capacity, or all of the card for a result without one.
func DRAShare(consumed map[resourceapi.QualifiedName]resource.Quantity, card Card) (memoryMiB, cores int64) {
	memoryMiB, cores = card.MemoryMiB, FullCores
	if q, ok := consumed[DRAMemory]; ok {
		memoryMiB = MiB(q)
	}
	if q, ok := consumed[DRACores]; ok {
		cores = q.Value()
	}
	return memoryMiB, cores
}

// Topology attributes of a card's DRA device: the standard PCIe root and
// NUMA node (resource.kubernetes.io, shared with other drivers' devices) and
// the card's NVLink domain on its node (from 1; absent without NVLink).
const (
	DRAPCIeRootAttribute     = "resource.kubernetes.io/pcieRoot"
	DRANUMANodeAttribute     = "resource.kubernetes.io/numaNode"
	DRANVLinkDomainAttribute = "nvlinkDomain"
)

// DRANVLinkDomain is the NVLink domain a card's device publishes; 0 for
// none.
func DRANVLinkDomain(d *resourceapi.Device) int64 {
	if a := d.Attributes[DRANVLinkDomainAttribute]; a.IntValue != nil && *a.IntValue > 0 {
		return *a.IntValue
	}
	return 0
}

// DRALink is the link between two cards as their devices' attributes tell
// it (domain, the NVLink domain, and card, its NUMA node and PCIe root),
// which is coarser than the inventory's links: NVLink in one NVLink domain,
// else LinkHostBridge under one PCIe root (a switch below it is not
// published), else LinkNUMANode on one NUMA node, else LinkSystem where both
// NUMA nodes are known; LinkUnknown otherwise.
func DRALink(domainA, domainB int64, a, b *Card) LinkClass {
	switch {
	case domainA > 0 && domainA == domainB:
		return LinkNVLink
	case a.PCIeRoot != "" && a.PCIeRoot == b.PCIeRoot:
		return LinkHostBridge
	case a.NUMANode >= 0 && a.NUMANode == b.NUMANode:
		return LinkNUMANode
	case a.NUMANode >= 0 && b.NUMANode >= 0:
		return LinkSystem
	}
	return LinkUnknown
}
