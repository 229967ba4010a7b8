package discovery

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

var _ MIGController = (*Simulated)(nil)

// simSlice is a simulated MIG instance of node "n", card 0; the simulated
// backend numbers GPU instances from 1 by MIG device index.
func simSlice(profile string, start, index int) gpuinfo.MIGInstance {
	return gpuinfo.MIGInstance{Profile: profile, Start: start, UUID: fmt.Sprintf("MIG-sim-n-0-%d", start), Index: index, GPUInstance: index + 1, Healthy: true}
}

// TestSimulatedMIGSpec: "mig=" and "mig-dynamic=" put the cards in MIG mode
// with the instances listed, each at its start or the first free one, the
// latter dynamic; a list the card cannot hold is refused.
func TestSimulatedMIGSpec(t *testing.T) {
	tests := []struct {
		spec        string
		wantDynamic bool
		want        []gpuinfo.MIGInstance
		wantErr     string
	}{
		{spec: "1xA100-40GB:mig-dynamic=", wantDynamic: true, want: []gpuinfo.MIGInstance{}},
		{spec: "1xA100-40GB:mig-dynamic=3g.20gb@4", wantDynamic: true, want: []gpuinfo.MIGInstance{simSlice("3g.20gb", 4, 0)}},
		{spec: "1xA100-40GB:mig=", want: []gpuinfo.MIGInstance{}},
		{spec: "1xA100-40GB:mig=3g.20gb+1g.5gb+1g.5gb@6+1g.5gb", want: []gpuinfo.MIGInstance{
			simSlice("3g.20gb", 0, 0), simSlice("1g.5gb", 4, 1), simSlice("1g.5gb", 6, 2), simSlice("1g.5gb", 5, 3),
		}},
		{spec: "1xA100-40GB:dynamic=", wantErr: "want mig=PROFILE[@START]+... or mig-dynamic=PROFILE[@START]+..."},
		{spec: "1xT4-16GB:mig-dynamic=", wantErr: "model T4-16GB: no MIG profiles known"},
		{spec: "1xA100-40GB:mig=5g.25gb", wantErr: `MIG instance "5g.25gb" on a A100-40GB: no profile "5g.25gb"`},
		{spec: "1xA100-40GB:mig=3g.20gb@x", wantErr: `MIG instance "3g.20gb@x" on a A100-40GB: start "x" is not a slot number`},
		{spec: "1xA100-40GB:mig=2g.10gb@1", wantErr: "profile 2g.10gb cannot start at slot 1 (its starts: [0 2 4])"},
		{spec: "1xA100-40GB:mig=7g.40gb+1g.5gb", wantErr: "no free placement for profile 1g.5gb"},
		{spec: "1xA100-40GB:mig=1g.5gb@0+2g.10gb@0", wantErr: "profile 2g.10gb at slot 0: slots 0-1 are not all free"},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			s, err := NewSimulated("n", tc.spec)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			cards, _ := s.Cards()
			if c := cards[0]; !c.MIGEnabled || c.MIGDynamic != tc.wantDynamic || c.MIG == nil {
				t.Fatalf("card: MIG enabled %t, dynamic %t, geometry %v; want MIG enabled, dynamic %t, a geometry", c.MIGEnabled, c.MIGDynamic, c.MIG, tc.wantDynamic)
			}
			if diff := cmp.Diff(tc.want, cards[0].MIG.Instances); diff != "" {
				t.Errorf("instances (-want,+got):\n%s", diff)
			}
		})
	}
}

// simOp creates (or, with destroy, destroys) a slice on a simulated card,
// creating the UUID wantUUID, or failing with wantErr unless it is empty.
type simOp struct {
	destroy  bool
	card     int
	profile  string
	start    int
	wantUUID string
	wantErr  string
}

// TestSimulatedMIGController: the simulated backend creates slices where
// their profile allows and their slots are free, with the lowest free MIG
// device index, and destroys them; destroying one that does not exist is
// not an error. Card 0 is dynamic, card 1 not in MIG mode.
func TestSimulatedMIGController(t *testing.T) {
	tests := []struct {
		name string
		ops  []simOp
		// want are card 0's instances at the end.
		want []gpuinfo.MIGInstance
	}{
		{"create", []simOp{
			{profile: "3g.20gb", start: 4, wantUUID: "MIG-sim-n-0-4"}, {profile: "1g.5gb", start: 0, wantUUID: "MIG-sim-n-0-0"},
		}, []gpuinfo.MIGInstance{simSlice("3g.20gb", 4, 0), simSlice("1g.5gb", 0, 1)}},
		{"overlapping", []simOp{
			{profile: "1g.5gb", start: 0, wantUUID: "MIG-sim-n-0-0"},
			{profile: "4g.20gb", start: 0, wantErr: "creating MIG slice 4g.20gb@0 on card 0: profile 4g.20gb at slot 0: slots 0-3 are not all free"},
		}, []gpuinfo.MIGInstance{simSlice("1g.5gb", 0, 0)}},
		{"unknown profile", []simOp{{profile: "5g.25gb", wantErr: `no profile "5g.25gb"`}}, []gpuinfo.MIGInstance{}},
		{"start the profile does not allow", []simOp{
			{profile: "3g.20gb", start: 2, wantErr: "profile 3g.20gb cannot start at slot 2 (its starts: [0 4])"},
		}, []gpuinfo.MIGInstance{}},
		{"card not in MIG mode", []simOp{
			{card: 1, profile: "1g.5gb", wantErr: "creating MIG slice 1g.5gb@0 on card 1: card 1 is not in MIG mode"},
			{destroy: true, card: 1, profile: "1g.5gb"},
		}, []gpuinfo.MIGInstance{}},
		{"no such card", []simOp{
			{card: 2, profile: "1g.5gb", wantErr: "no card 2"},
			{destroy: true, card: 2, profile: "1g.5gb", wantErr: "destroying MIG slice 1g.5gb@0 on card 2: no card 2"},
		}, []gpuinfo.MIGInstance{}},
		{"destroy, then create with the lowest free index", []simOp{
			{profile: "3g.20gb", start: 4, wantUUID: "MIG-sim-n-0-4"}, {profile: "1g.5gb", start: 0, wantUUID: "MIG-sim-n-0-0"},
			{destroy: true, profile: "3g.20gb", start: 4}, {profile: "2g.10gb", start: 4, wantUUID: "MIG-sim-n-0-4"},
		}, []gpuinfo.MIGInstance{simSlice("1g.5gb", 0, 1), simSlice("2g.10gb", 4, 0)}},
		{"destroy a missing slice", []simOp{
			{profile: "3g.20gb", start: 4, wantUUID: "MIG-sim-n-0-4"},
			{destroy: true, profile: "3g.20gb", start: 0}, {destroy: true, profile: "1g.5gb", start: 4}, {destroy: true, profile: "5g.25gb", start: 4},
		}, []gpuinfo.MIGInstance{simSlice("3g.20gb", 4, 0)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSimulated("n", "1xA100-40GB:mig-dynamic=,1xT4-16GB")
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range tc.ops {
				runSimOp(t, s, op)
			}
			cards, _ := s.Cards()
			if diff := cmp.Diff(tc.want, cards[0].MIG.Instances); diff != "" {
				t.Errorf("card 0's instances (-want,+got):\n%s", diff)
			}
			if cards[1].MIGEnabled || cards[1].MIG != nil {
				t.Errorf("card 1: MIG enabled %t, geometry %v; want neither", cards[1].MIGEnabled, cards[1].MIG)
			}
			if err := Inventory(cards, gpuinfo.InventoryVersion2).Validate(); err != nil {
				t.Errorf("inventory is invalid: %v", err)
			}
		})
	}
}

// runSimOp runs op on s, checking its outcome.
func runSimOp(t *testing.T, s *Simulated, op simOp) {
	t.Helper()
	if op.destroy {
		testutil.CheckError(t, s.DestroyMIGSlice(op.card, op.profile, op.start), op.wantErr)
		return
	}
	uuid, err := s.CreateMIGSlice(op.card, op.profile, op.start)
	if !testutil.CheckError(t, err, op.wantErr) && uuid != op.wantUUID {
		t.Errorf("creating %s@%d: UUID %q, want %q", op.profile, op.start, uuid, op.wantUUID)
	}
}

// TestInventoryDynamicMIG: version 2 of the inventory marks the geometry of
// dynamic cards, without changing the backend's; version 1 has none.
func TestInventoryDynamicMIG(t *testing.T) {
	s, err := NewSimulated("n", "1xA100-40GB:mig-dynamic=,1xA100-40GB:mig=1g.5gb,1xT4-16GB")
	if err != nil {
		t.Fatal(err)
	}
	cards, _ := s.Cards()
	for _, tc := range []struct {
		version int
		// want is, by card, "dynamic", "static", or "none" without a
		// geometry.
		want []string
	}{
		{gpuinfo.InventoryVersion2, []string{"dynamic", "static", "none"}},
		{1, []string{"none", "none", "none"}},
	} {
		inv := Inventory(cards, tc.version)
		if err := inv.Validate(); err != nil {
			t.Errorf("version %d: inventory is invalid: %v", tc.version, err)
		}
		var got []string
		for _, c := range inv.Cards {
			got = append(got, migKind(c.MIG))
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("version %d: geometry by card (-want,+got):\n%s", tc.version, diff)
		}
	}
	if again, _ := s.Cards(); again[0].MIG.Dynamic {
		t.Error("the backend's geometry is marked dynamic")
	}
}

// migKind is "dynamic", "static", or "none" for nil.
func migKind(m *gpuinfo.MIG) string {
	switch {
	case m == nil:
		return "none"
	case m.Dynamic:
		return "dynamic"
	}
	return "static"
}

// TestSimulatedCardsAreCopies: the cards Cards returned do not change when
// slices are created or destroyed afterwards, also while they are read.
func TestSimulatedCardsAreCopies(t *testing.T) {
	s, err := NewSimulated("n", "1xA100-40GB:mig-dynamic=1g.5gb@6")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.Cards()
	if _, err := s.CreateMIGSlice(0, "3g.20gb", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.DestroyMIGSlice(0, "1g.5gb", 6); err != nil {
		t.Fatal(err)
	}
	want := []gpuinfo.MIGInstance{simSlice("1g.5gb", 6, 0)}
	if diff := cmp.Diff(want, before[0].MIG.Instances); diff != "" {
		t.Errorf("instances read before (-want,+got):\n%s", diff)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 100 {
			if _, err := s.CreateMIGSlice(0, "2g.10gb", 4); err != nil {
				t.Error(err)
			}
			if err := s.DestroyMIGSlice(0, "2g.10gb", 4); err != nil {
				t.Error(err)
			}
		}
	}()
	for range 100 {
		cards, _ := s.Cards()
		if in := cards[0].MIG.Instances; len(in) == 0 || in[0] != simSlice("3g.20gb", 0, 1) {
			t.Errorf("instances while slices come and go: %v", in)
			break
		}
	}
	wg.Wait()
}
