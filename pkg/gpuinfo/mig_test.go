package gpuinfo_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// migInventory is a version 2 inventory of one A100 40GB card in MIG mode
// with a 3g.20gb slice at slot 4 and a 1g.5gb one at slot 0.
func migInventory() *gpuinfo.Inventory {
	return &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion2, Cards: []gpuinfo.Card{{
		Index: 0, UUID: "GPU-a", Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Cores: 100, NUMANode: -1, Healthy: true, MIGEnabled: true,
		MIG: &gpuinfo.MIG{Slots: 8, Profiles: []gpuinfo.MIGProfile{
			{Name: "1g.5gb", ID: 0, Slices: 1, Size: 1, MemoryMiB: 4864, Multiprocessors: 14, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
			{Name: "3g.20gb", ID: 2, Slices: 3, Size: 4, MemoryMiB: 19968, Multiprocessors: 42, Starts: []int{0, 4}},
		}, Instances: []gpuinfo.MIGInstance{
			{Profile: "3g.20gb", Start: 4, UUID: "MIG-b", Index: 0, Healthy: true},
			{Profile: "1g.5gb", Start: 0, UUID: "MIG-c", Index: 1, Healthy: true},
		}},
	}}}
}

// TestOlderReaderRefusesVersion2: a scheduler of the release before version
// 2 reads the annotation into its version 1 types and refuses any version
// but 1, first thing (pkg/gpuinfo/inventory.go at de21641: "unsupported
// version %d, want %d"): a version 2 inventory must keep its version where
// that reader looks, so that the node's cards are refused with that reason
// rather than the card in MIG mode read as a whole card.
func TestOlderReaderRefusesVersion2(t *testing.T) {
	raw, err := migInventory().Encode()
	if err != nil {
		t.Fatal(err)
	}
	var v1Reader struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal([]byte(raw), &v1Reader); err != nil {
		t.Fatal(err)
	}
	if v1Reader.Version != 2 {
		t.Errorf("a version 1 reader finds version %d, want 2, which it refuses", v1Reader.Version)
	}
	// This release reads both, and says what to do about a newer one.
	v1 := migInventory()
	v1.Version, v1.Cards[0].MIG = gpuinfo.InventoryVersion1, nil
	for _, inv := range []*gpuinfo.Inventory{v1, migInventory()} {
		if err := inv.Validate(); err != nil {
			t.Errorf("version %d: %v", inv.Version, err)
		}
	}
	v3 := migInventory()
	v3.Version = 3
	if err := v3.Validate(); err == nil || !strings.Contains(err.Error(), "unsupported version 3, want 1-2 (written by a newer node agent: upgrade the scheduler, or run the agent with --inventory-version=2)") {
		t.Errorf("version 3: %v", err)
	}
}

func TestMIGInventoryErrors(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*gpuinfo.Inventory)
		wantErr string
	}{
		{"MIG in version 1", func(inv *gpuinfo.Inventory) { inv.Version = 1 }, "cards[0].mig: needs inventory version 2"},
		{"MIG without MIG mode", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIGEnabled = false }, "cards[0].mig: set on a card whose migEnabled is false"},
		{"no slots", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Slots = 0 }, "cards[0].mig.slots: 0 is outside 1-16"},
		{"profile name with a slash", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Profiles[0].Name = "1g/5gb" }, "cards[0].mig.profiles[0].name"},
		{"profile twice", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Profiles[1].Name = "1g.5gb" }, `cards[0].mig.profiles[1].name: "1g.5gb" appears twice`},
		{"profile larger than the card", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Profiles[1].MemoryMiB = 50000 }, "cards[0].mig.profiles[1].memoryMiB: 50000 is outside 1-40960"},
		{"start past the slots", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Profiles[1].Starts = []int{0, 5} }, "cards[0].mig.profiles[1].starts[1]: 5 is outside 0-4"},
		{"unknown profile", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[0].Profile = "7g.40gb" }, `cards[0].mig.instances[0].profile: "7g.40gb" is not one of the card's profiles`},
		{"start not allowed", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[0].Start = 2 }, "cards[0].mig.instances[0].start: profile 3g.20gb cannot start at slot 2"},
		{"overlapping instances", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[1].Start = 5 }, "cards[0].mig.instances[1].start: slot 5 is taken by another instance"},
		{"instance UUID of the card", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[1].UUID = "GPU-a" }, `cards[0].mig.instances[1].uuid: "GPU-a" appears twice on the node`},
		{"MIG device index twice", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[1].Index = 0 }, "cards[0].mig.instances[1].index: 0 appears twice on the card"},
		{"MIG device index past the slots", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[1].Index = 8 }, "cards[0].mig.instances[1].index: 8 is outside 0-7"},
		{"empty instance UUID", func(inv *gpuinfo.Inventory) { inv.Cards[0].MIG.Instances[1].UUID = "" }, "cards[0].mig.instances[1].uuid: must be 1-256 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := migInventory()
			tt.change(inv)
			err := inv.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestMIGAssignment(t *testing.T) {
	a := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{
		"c": {{Index: 0, UUID: "GPU-a", MemoryMiB: 4096, Cores: 0}},
	}}
	if got := a.NeededVersion(); got != gpuinfo.AssignmentVersion1 {
		t.Errorf("NeededVersion without MIG = %d, want 1", got)
	}
	if got, want := a.Containers["c"][0].Key(), "GPU-a"; got != want {
		t.Errorf("Key() = %q, want %q", got, want)
	}
	a.Containers["c"][0].MIG = &gpuinfo.MIGSlice{Profile: "1g.5gb", Start: 6, UUID: "MIG-c"}
	if got := a.NeededVersion(); got != gpuinfo.AssignmentVersion2 {
		t.Errorf("NeededVersion with MIG = %d, want 2", got)
	}
	if got, want := a.Containers["c"][0].Key(), "GPU-a/1g.5gb@6"; got != want {
		t.Errorf("Key() = %q, want %q", got, want)
	}
	// An agent of the release before must not read the slice as the card.
	if err := a.Validate(); err == nil || !strings.Contains(err.Error(), `containers["c"][0].mig: needs assignment version 2`) {
		t.Errorf("version 1 with a MIG slice: Validate() = %v", err)
	}
	a.Version = gpuinfo.AssignmentVersion2
	raw, err := a.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, back); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
	a.Containers["c"][0].MIG.Start = 16
	if err := a.Validate(); err == nil || !strings.Contains(err.Error(), "mig.start: 16 is outside 0-15") {
		t.Errorf("start 16: Validate() = %v", err)
	}
}
