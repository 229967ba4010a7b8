package enforce

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestCheckDevices: GPU device nodes reach a container only for the cards it
// holds, by path or by numbers, whatever brought them.
func TestCheckDevices(t *testing.T) {
	cards := testCards()
	cards[3].Minor = 7 // minor numbers need not follow indices
	holds := func(indices ...int) []Holding {
		h := Holding{Key: "container/ctr-1"}
		for _, i := range indices {
			h.Cards = append(h.Cards, gpuinfo.CardAssignment{Index: i, UUID: cards[i].UUID, MemoryMiB: 1024})
		}
		return []Holding{h}
	}
	card := func(minor int64) DeviceNode {
		return DeviceNode{Path: "/dev/nvidia" + itoa(minor), Type: "c", Major: 195, Minor: minor}
	}
	ctl := DeviceNode{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255}
	uvm := DeviceNode{Path: "/dev/nvidia-uvm", Type: "c", Major: 508, Minor: 0}
	null := DeviceNode{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}
	for _, tc := range []struct {
		name     string
		devices  []DeviceNode
		holdings []Holding
		cards    []discovery.Card
		wantErr  string
	}{
		{name: "no GPU devices, no card", devices: []DeviceNode{null}},
		{name: "its own card with the control devices", devices: []DeviceNode{card(1), ctl, uvm}, holdings: holds(1)},
		{name: "its card by its minor number, not its index", devices: []DeviceNode{card(7)}, holdings: holds(3)},
		{name: "the card whose minor equals its index is another card", devices: []DeviceNode{card(3)}, holdings: holds(3), wantErr: "/dev/nvidia3 (card minor 3), which is not a card it was assigned"},
		{name: "another card beside its own", devices: []DeviceNode{card(1), card(2)}, holdings: holds(1), wantErr: "device /dev/nvidia2 (card minor 2)"},
		{name: "every card (nvidia.com/gpu=all) without an assignment", devices: []DeviceNode{card(0), card(1), ctl}, wantErr: "device /dev/nvidia0 (card minor 0), which is not a card it was assigned"},
		{name: "a control device without a card", devices: []DeviceNode{ctl}, wantErr: "the GPU device /dev/nvidiactl but was assigned no card"},
		{name: "uvm without a card", devices: []DeviceNode{uvm}, wantErr: "the GPU device /dev/nvidia-uvm"},
		{name: "a card node under another path", devices: []DeviceNode{{Path: "/dev/mydev", Type: "c", Major: 195, Minor: 2}}, holdings: holds(1), wantErr: "device /dev/mydev (card minor 2)"},
		{name: "a held card's path over another card's numbers", devices: []DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 2}}, holdings: holds(1), wantErr: "(card minor 2)"},
		{name: "a card path under other numbers", devices: []DeviceNode{{Path: "/dev/nvidia2", Type: "c", Major: 1, Minor: 3}}, holdings: holds(1), wantErr: "device /dev/nvidia2 (card minor 2)"},
		{name: "a card whose minor number is unknown is never matched", devices: []DeviceNode{card(1)}, holdings: holds(1),
			cards: func() []discovery.Card { c := testCards(); c[1].Minor = -1; return c }(), wantErr: "(card minor 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cards
			if tc.cards != nil {
				c = tc.cards
			}
			testutil.CheckError(t, CheckDevices(tc.devices, tc.holdings, Node{Cards: c}), tc.wantErr)
		})
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

// migMinors is a driver's list of MIG capabilities for card minor 1 with two
// slices: GPU instance 1 (compute instance 0) and GPU instance 2.
const migMinors = `config 1
monitor 2
gpu1/gi1/access 12
gpu1/gi1/ci0/access 13
gpu1/gi2/access 21
gpu1/gi2/ci0/access 22
`

// TestCheckMIGCaps: a container given a MIG slice gets its card's node and
// its own slice's two capability nodes, and no other capability: not
// another slice's, not config or monitor, not under another path; a
// container without a slice gets none; without the driver's list, none.
func TestCheckMIGCaps(t *testing.T) {
	node := migTestNode()
	node.Cards[1].MIG.Instances[0].GPUInstance = 1 // 3g.40gb@4
	node.Cards[1].MIG.Instances[1].GPUInstance = 2 // 1g.10gb@0
	dir := t.TempDir()
	minors, devices := filepath.Join(dir, "mig-minors"), filepath.Join(dir, "devices")
	if err := os.WriteFile(minors, []byte(migMinors), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(devices, []byte("Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n\nBlock devices:\n  8 sd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	node.MIGCaps = func() (MIGCaps, error) { return ReadMIGCaps(minors, devices) }
	slice := []Holding{{Key: "container/ctr-1", Cards: []gpuinfo.CardAssignment{
		{Index: 1, UUID: "GPU-1", MemoryMiB: 40192, Cores: 100, MIG: &gpuinfo.MIGSlice{Profile: "3g.40gb", Start: 4, UUID: "MIG-a"}},
	}}}
	wholeCard := []Holding{{Key: "container/ctr-1", Cards: []gpuinfo.CardAssignment{{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Cores: 100}}}}
	capNode := func(minor int64) DeviceNode {
		return DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap" + itoa(minor), Type: "c", Major: 237, Minor: minor}
	}
	card1 := DeviceNode{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}
	for _, tc := range []struct {
		name     string
		devices  []DeviceNode
		holdings []Holding
		caps     func() (MIGCaps, error)
		wantErr  string
	}{
		{name: "its card and its own slice's capabilities", devices: []DeviceNode{card1, capNode(12), capNode(13)}, holdings: slice},
		{name: "another slice's capability", devices: []DeviceNode{card1, capNode(12), capNode(21)}, holdings: slice,
			wantErr: "MIG capability device /dev/nvidia-caps/nvidia-cap21 (minor 21), which is not one of its own MIG slices'"},
		{name: "the config capability", devices: []DeviceNode{card1, capNode(1)}, holdings: slice, wantErr: "nvidia-cap1 (minor 1)"},
		{name: "monitor, under another path", devices: []DeviceNode{card1, {Path: "/dev/mon", Type: "c", Major: 237, Minor: 2}}, holdings: slice,
			wantErr: "MIG capability device /dev/mon (minor 2)"},
		{name: "a capability for a whole card", devices: []DeviceNode{{Path: "/dev/nvidia2", Type: "c", Major: 195, Minor: 2}, capNode(12)}, holdings: wholeCard,
			wantErr: "nvidia-cap12 (minor 12), which is not one of its own MIG slices'"},
		{name: "without the driver's list", devices: []DeviceNode{card1, capNode(12)}, holdings: slice,
			caps:    func() (MIGCaps, error) { return ReadMIGCaps(filepath.Join(dir, "missing"), devices) },
			wantErr: "the container would get MIG capability devices, and reading the MIG capabilities"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := node
			if tc.caps != nil {
				n.MIGCaps = tc.caps
			}
			testutil.CheckError(t, CheckDevices(tc.devices, tc.holdings, n), tc.wantErr)
		})
	}
}

func TestParseMIGMinors(t *testing.T) {
	if _, err := parseMIGMinors(strings.NewReader("gpu0/gi1/access twelve\n")); err == nil {
		t.Error("a line without a minor number was read")
	}
	caps, err := parseMIGMinors(strings.NewReader(migMinors))
	if err != nil {
		t.Fatal(err)
	}
	if got := caps.sliceCaps(1, 2, 0); !slices.Equal(got, []int64{21, 22}) {
		t.Errorf("slice gi2/ci0 of card minor 1: capabilities %v, want [21 22]", got)
	}
}
