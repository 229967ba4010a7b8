package discovery

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestSimulatedTopology(t *testing.T) {
	s, err := NewSimulated("n", "4xH100-80GB, topology=pcie-sockets")
	if err != nil {
		t.Fatal(err)
	}
	cards, _ := s.Cards()
	inv := Inventory(cards, gpuinfo.InventoryVersion2)
	if err := inv.Validate(); err != nil {
		t.Fatalf("inventory: %v", err)
	}
	// Pairs (0,1) (0,2) (0,3) (1,2) (1,3) (2,3): a PCIe switch per pair of
	// cards, a socket per switch.
	if inv.Version != gpuinfo.InventoryVersion2 || inv.Links != "PSSSSP" {
		t.Errorf("version %d, links %q; want 2, %q", inv.Version, inv.Links, "PSSSSP")
	}
	var roots []string
	var numa []int
	for _, c := range inv.Cards {
		roots, numa = append(roots, c.PCIeRoot), append(numa, c.NUMANode)
	}
	if diff := cmp.Diff([]string{"pci0000:00", "pci0000:00", "pci0000:80", "pci0000:80"}, roots); diff != "" {
		t.Errorf("PCIe roots (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 0, 1, 1}, numa); diff != "" {
		t.Errorf("NUMA nodes (-want,+got):\n%s", diff)
	}

	_, err = NewSimulated("n", "2xT4-16GB,topology=torus")
	testutil.CheckError(t, err, "want topology=nvswitch|nvlink-quads|pcie-sockets")
}

// TestInventoryVersionForLinks: links make version 2 only where they say
// something and the agent may write version 2.
func TestInventoryVersionForLinks(t *testing.T) {
	linked := []Card{
		{Index: 0, UUID: "a", Model: "H100", MemoryMiB: 1, PCIeRoot: "pci0000:00", Links: []gpuinfo.LinkClass{0, gpuinfo.LinkNVLink}},
		{Index: 1, UUID: "b", Model: "H100", MemoryMiB: 1, PCIeRoot: "pci0000:00", Links: []gpuinfo.LinkClass{gpuinfo.LinkNVLink, 0}},
	}
	unknown := []Card{
		{Index: 0, UUID: "a", Model: "H100", MemoryMiB: 1, PCIeRoot: "pci0000:00", Links: []gpuinfo.LinkClass{0, 0}},
		{Index: 1, UUID: "b", Model: "H100", MemoryMiB: 1, PCIeRoot: "pci0000:00"},
	}
	tests := []struct {
		name        string
		cards       []Card
		newest      int
		wantVersion int
		wantLinks   string
		wantRoot    string
	}{
		{"links known", linked, gpuinfo.InventoryVersion2, gpuinfo.InventoryVersion2, "V", "pci0000:00"},
		{"links left out for old schedulers", linked, gpuinfo.InventoryVersion1, gpuinfo.InventoryVersion1, "", ""},
		{"no link known", unknown, gpuinfo.InventoryVersion2, gpuinfo.InventoryVersion1, "", ""},
		{"one card", linked[:1], gpuinfo.InventoryVersion2, gpuinfo.InventoryVersion1, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := Inventory(tc.cards, tc.newest)
			if err := inv.Validate(); err != nil {
				t.Fatal(err)
			}
			if inv.Version != tc.wantVersion || inv.Links != tc.wantLinks || inv.Cards[0].PCIeRoot != tc.wantRoot {
				t.Errorf("version %d, links %q, root %q; want %d, %q, %q", inv.Version, inv.Links, inv.Cards[0].PCIeRoot, tc.wantVersion, tc.wantLinks, tc.wantRoot)
			}
		})
	}
}
