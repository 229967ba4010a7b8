package enforce

import (
	"strconv"
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
			testutil.CheckError(t, CheckDevices(tc.devices, tc.holdings, c), tc.wantErr)
		})
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
