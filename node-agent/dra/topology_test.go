package dra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestStandardAttributeNames: the names the scheduler reads are the ones
// Kubernetes defines.
func TestStandardAttributeNames(t *testing.T) {
	if gpuinfo.DRAPCIeRootAttribute != string(deviceattribute.StandardDeviceAttributePCIeRoot) ||
		gpuinfo.DRANUMANodeAttribute != string(deviceattribute.StandardDeviceAttributeNUMANode) {
		t.Errorf("gpuinfo's names %q and %q differ from Kubernetes' %q and %q", gpuinfo.DRAPCIeRootAttribute, gpuinfo.DRANUMANodeAttribute,
			deviceattribute.StandardDeviceAttributePCIeRoot, deviceattribute.StandardDeviceAttributeNUMANode)
	}
}

// TestResourcesTopology: cards publish the standard PCIe root and NUMA node
// and their NVLink domain; a MIG slice its card's.
func TestResourcesTopology(t *testing.T) {
	backend, err := discovery.NewSimulated(node, "8xH100-80GB,topology=nvlink-quads")
	if err != nil {
		t.Fatal(err)
	}
	cards, _ := backend.Cards()
	pcie, err := discovery.NewSimulated(node, "1xA100-40GB:mig=1g.5gb,3xA100-40GB,topology=pcie-sockets")
	if err != nil {
		t.Fatal(err)
	}
	pcieCards, _ := pcie.Cards()
	type attrs struct {
		Root           string
		NUMA, Standard int64
		Domain         int64
	}
	read := func(d resourceapi.Device) attrs {
		var a attrs
		if v, ok := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]; ok {
			a.Root = *v.StringValue
		}
		if v, ok := d.Attributes["numaNode"]; ok {
			a.NUMA = *v.IntValue
		}
		if v, ok := d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode]; ok {
			a.Standard = *v.IntValue
		}
		if v, ok := d.Attributes[gpuinfo.DRANVLinkDomainAttribute]; ok {
			a.Domain = *v.IntValue
		}
		return a
	}
	for _, tc := range []struct {
		name  string
		cards []discovery.Card
		want  []attrs
	}{
		{"two NVLink quads", cards, []attrs{
			{"pci0000:00", 0, 0, 1}, {"pci0000:00", 0, 0, 1}, {"pci0000:00", 0, 0, 1}, {"pci0000:00", 0, 0, 1},
			{"pci0000:80", 1, 1, 2}, {"pci0000:80", 1, 1, 2}, {"pci0000:80", 1, 1, 2}, {"pci0000:80", 1, 1, 2},
		}},
		{"PCIe, no NVLink, and a MIG slice of card 0", pcieCards, []attrs{
			{"pci0000:00", 0, 0, 0}, {"pci0000:00", 0, 0, 0}, {"pci0000:80", 1, 1, 0}, {"pci0000:80", 1, 1, 0},
			{"pci0000:00", 0, 0, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []attrs
			for _, s := range resources(node, tc.cards, nil).Pools[node].Slices {
				for _, d := range s.Devices {
					got = append(got, read(d))
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("topology attributes (-want,+got):\n%s", diff)
			}
		})
	}
}
