package nvidia

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// mockNVLinks is how many NVLinks each mock card has, as an A100.
const mockNVLinks = 12

// mockTopology is how the cards of a go-nvml mock server are linked, as
// NVML's queries answer; the pair functions are called with i < j.
type mockTopology struct {
	// p2p answers the NVLink P2P query of cards i and j.
	p2p func(i, j int) (nvml.GpuP2PStatus, nvml.Return)
	// ancestor answers the closest common PCIe ancestor query of cards i
	// and j.
	ancestor func(i, j int) (nvml.GpuTopologyLevel, nvml.Return)
	// nvLinks tells how many of card i's mockNVLinks links are active and
	// the type of device all its links lead to; nil when the cards have no
	// NVLink (ERROR_NOT_SUPPORTED).
	nvLinks func(i int) (active int, remote nvml.IntNvLinkDeviceType)
}

// nvSwitchTopology is a DGX's: every card's NVLinks lead to NVSwitch, which
// NVML's P2P query does not report; the PCIe tree has a socket per four
// cards.
var nvSwitchTopology = mockTopology{
	p2p: func(int, int) (nvml.GpuP2PStatus, nvml.Return) {
		return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
	},
	ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
		if i/4 != j/4 {
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		return nvml.TOPOLOGY_NODE, nvml.SUCCESS
	},
	nvLinks: func(int) (int, nvml.IntNvLinkDeviceType) { return mockNVLinks, nvml.NVLINK_DEVICE_TYPE_SWITCH },
}

// pcieSocketsTopology is four PCIe cards without NVLink, two per socket:
// cards 0 and 1 behind one PCIe switch, 2 and 3 behind several; NVML cannot
// tell how cards 1 and 3 are linked. The P2P query fails, with a zero
// status (P2P_STATUS_OK).
var pcieSocketsTopology = mockTopology{
	p2p: func(int, int) (nvml.GpuP2PStatus, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
	ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
		switch [2]int{i, j} {
		case [2]int{0, 1}:
			return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
		case [2]int{2, 3}:
			return nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS
		case [2]int{1, 3}:
			return 0, nvml.ERROR_UNKNOWN
		}
		return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
	},
}

// setTopology links the cards of s as topology says; the peer a query
// names is found among s's devices.
func setTopology(s *server.Server, topology mockTopology) {
	for i, dev := range s.Devices {
		d := dev.(*server.Device)
		pair := func(peer nvml.Device) (int, int) {
			j := slices.Index(s.Devices, peer)
			return min(i, j), max(i, j)
		}
		d.GetP2PStatusFunc = func(peer nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			if caps != nvml.P2P_CAPS_INDEX_NVLINK {
				return nvml.P2P_STATUS_UNKNOWN, nvml.ERROR_NOT_SUPPORTED
			}
			return topology.p2p(pair(peer))
		}
		d.GetTopologyCommonAncestorFunc = func(peer nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return topology.ancestor(pair(peer))
		}
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			switch {
			case topology.nvLinks == nil:
				return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
			case link >= mockNVLinks:
				return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
			}
			if active, _ := topology.nvLinks(i); link < active {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if topology.nvLinks == nil || link >= mockNVLinks {
				return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_NOT_SUPPORTED
			}
			_, remote := topology.nvLinks(i)
			return remote, nvml.SUCCESS
		}
	}
}

// setBusIDs makes the mock cards of s report their PCI bus IDs, which
// go-nvml's mock leaves empty.
func setBusIDs(s *server.Server) {
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		info := d.GetPciInfoFunc
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			pci, ret := info()
			for i, c := range []byte(d.PciBusID) {
				pci.BusIdLegacy[i] = int8(c)
			}
			return pci, ret
		}
	}
}

// linkMatrix reads the rows of a links matrix, one letter of
// gpuinfo.LinkLetters a class, like nvidia-smi topo -m.
func linkMatrix(rows ...string) [][]gpuinfo.LinkClass {
	m := make([][]gpuinfo.LinkClass, len(rows))
	for i, row := range rows {
		for _, letter := range []byte(row) {
			m[i] = append(m[i], gpuinfo.LinkClass(strings.IndexByte(gpuinfo.LinkLetters, letter)))
		}
	}
	return m
}

// cardLinks are the cards' Links, by position.
func cardLinks(cards []discovery.Card) [][]gpuinfo.LinkClass {
	m := make([][]gpuinfo.LinkClass, len(cards))
	for i, c := range cards {
		m[i] = c.Links
	}
	return m
}

// newMockServer is a go-nvml mock server of count cards of config.
func newMockServer(t *testing.T, count int, config gpus.Config) *server.Server {
	t.Helper()
	s, err := server.New(server.WithGPUs(gpus.Multiple(count, config)...))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLinks: the links between the cards are NVLink between cards on
// NVSwitch or NVLink peers, else their PCIe relation; what NVML cannot tell
// is unknown, and the cards stay healthy.
func TestLinks(t *testing.T) {
	tests := []struct {
		name     string
		count    int
		config   gpus.Config
		topology mockTopology
		want     [][]gpuinfo.LinkClass
	}{
		{"8 cards on NVSwitch", 8, gpus.A100_SXM4_40GB, nvSwitchTopology, linkMatrix(
			"?VVVVVVV",
			"V?VVVVVV",
			"VV?VVVVV",
			"VVV?VVVV",
			"VVVV?VVV",
			"VVVVV?VV",
			"VVVVVV?V",
			"VVVVVVV?",
		)},
		{"two NVLink quads", 8, gpus.A100_SXM4_40GB, mockTopology{
			p2p: func(i, j int) (nvml.GpuP2PStatus, nvml.Return) {
				if i/4 == j/4 {
					return nvml.P2P_STATUS_OK, nvml.SUCCESS
				}
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			},
			ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
				if i/4 != j/4 {
					return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
				}
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			},
			// Direct NVLinks lead to cards, not NVSwitch.
			nvLinks: func(int) (int, nvml.IntNvLinkDeviceType) { return mockNVLinks, nvml.NVLINK_DEVICE_TYPE_GPU },
		}, linkMatrix(
			"?VVVSSSS",
			"V?VVSSSS",
			"VV?VSSSS",
			"VVV?SSSS",
			"SSSS?VVV",
			"SSSSV?VV",
			"SSSSVV?V",
			"SSSSVVV?",
		)},
		{"4 PCIe cards on two sockets", 4, gpus.A100_PCIE_40GB, pcieSocketsTopology, linkMatrix(
			"?PSS",
			"P?S?",
			"SS?B",
			"S?B?",
		)},
		{"NVSwitch, card 3's NVLinks down", 4, gpus.A100_SXM4_40GB, mockTopology{
			p2p: nvSwitchTopology.p2p,
			// Asked only of pairs (0,3), (1,3) and (2,3): the others are on
			// NVSwitch.
			ancestor: func(i, j int) (nvml.GpuTopologyLevel, nvml.Return) {
				levels := []nvml.GpuTopologyLevel{nvml.TOPOLOGY_NODE, nvml.TOPOLOGY_HOSTBRIDGE, nvml.TOPOLOGY_INTERNAL}
				return levels[i], nvml.SUCCESS
			},
			nvLinks: func(i int) (int, nvml.IntNvLinkDeviceType) {
				if i == 3 {
					return 0, nvml.NVLINK_DEVICE_TYPE_SWITCH
				}
				return mockNVLinks, nvml.NVLINK_DEVICE_TYPE_SWITCH
			},
		}, linkMatrix(
			"?VVN",
			"V?VH",
			"VV?P",
			"NHP?",
		)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newMockServer(t, tc.count, tc.config)
			setTopology(s, tc.topology)
			n, err := New(s)
			if err != nil {
				t.Fatal(err)
			}
			cards, err := n.Cards()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cardLinks(cards)); diff != "" {
				t.Errorf("links (-want,+got):\n%s", diff)
			}
			for _, c := range cards {
				if !c.Healthy {
					t.Errorf("card %d is unhealthy", c.Index)
				}
			}
			inv := discovery.Inventory(cards, gpuinfo.InventoryVersion2)
			if err := inv.Validate(); err != nil {
				t.Errorf("inventory is invalid: %v", err)
			}
			if want := gpuinfo.LinkPairs(tc.count); len(inv.Links) != want {
				t.Errorf("inventory links %q: %d letters, want %d", inv.Links, len(inv.Links), want)
			}
		})
	}
}

// TestPCIeRoot: a card's PCIe root is the root complex its sysfs link leads
// under; "" without one.
func TestPCIeRoot(t *testing.T) {
	tests := []struct {
		name string
		// device is where the card's sysfs link leads, under the fake
		// /sys; "" for no link.
		device string
		want   string
	}{
		{"under a root port", "devices/pci0000:3a/0000:3a:00.0", "pci0000:3a"},
		{"behind a PCIe switch", "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0", "pci0000:00"},
		{"in a VMD domain", "devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0", "pci0000:00"},
		{"without a sysfs link", "", ""},
		{"outside any root complex", "devices/platform/gpu", ""},
	}
	s := newMockServer(t, len(tests), gpus.A100_PCIE_40GB)
	setTopology(s, nvSwitchTopology)
	setBusIDs(s)
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	sys := t.TempDir()
	n.sysfsPCI = filepath.Join(sys, "bus", "pci", "devices")
	if err := os.MkdirAll(n.sysfsPCI, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, tc := range tests {
		if tc.device == "" {
			continue
		}
		id := busID(mustPciInfo(t, s, i))
		if err := os.MkdirAll(filepath.Join(sys, tc.device, id), 0o755); err != nil {
			t.Fatal(err)
		}
		// As in sysfs: ../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0
		if err := os.Symlink(filepath.Join("..", "..", "..", tc.device, id), filepath.Join(n.sysfsPCI, id)); err != nil {
			t.Fatal(err)
		}
	}
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := cards[i].PCIeRoot; got != tc.want {
				t.Errorf("card %d's PCIe root = %q, want %q", i, got, tc.want)
			}
		})
	}
	if err := discovery.Inventory(cards, gpuinfo.InventoryVersion2).Validate(); err != nil {
		t.Errorf("inventory is invalid: %v", err)
	}
}

// mustPciInfo is the PCI info of card i of s.
func mustPciInfo(t *testing.T, s *server.Server, i int) nvml.PciInfo {
	t.Helper()
	pci, ret := s.Devices[i].GetPciInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("PCI info of card %d: %v", i, ret)
	}
	return pci
}

// TestLinksMeasuredOnce: the links are measured when the cards change, not
// at every scan; a card off the bus keeps its links, and a measurement
// missing one is not kept.
func TestLinksMeasuredOnce(t *testing.T) {
	s := newMockServer(t, 4, gpus.A100_PCIE_40GB)
	setTopology(s, pcieSocketsTopology)
	lost := loseCards(s)
	ancestorQueries := func() int {
		total := 0
		for _, d := range s.Devices {
			total += len(d.(*server.Device).GetTopologyCommonAncestorCalls())
		}
		return total
	}
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	measured := linkMatrix(
		"?PSS",
		"P?S?",
		"SS?B",
		"S?B?",
	)
	steps := []struct {
		name   string
		change func()
		// queries is how many ancestor queries the scan makes.
		queries int
		want    [][]gpuinfo.LinkClass
	}{
		{"first scan", func() {}, 6, measured},
		{"same cards", func() {}, 0, measured},
		{"card 3 off the bus", func() { lost[3] = true }, 0, measured},
		{"card 2 replaced while card 3 is off the bus", func() { s.Devices[2].(*server.Device).UUID = "GPU-replacement" }, 3, linkMatrix(
			"?PS?",
			"P?S?",
			"SS??",
			"S?B?",
		)},
		{"card 3 back", func() { lost[3] = false }, 6, measured},
		{"same cards again", func() {}, 0, measured},
	}
	for _, step := range steps {
		step.change()
		before := ancestorQueries()
		cards, err := n.Cards()
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := ancestorQueries() - before; got != step.queries {
			t.Errorf("%s: %d ancestor queries, want %d", step.name, got, step.queries)
		}
		if diff := cmp.Diff(step.want, cardLinks(cards)); diff != "" {
			t.Errorf("%s: links (-want,+got):\n%s", step.name, diff)
		}
	}
}
