package allocator_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// migNode is a node of A100 40GB cards as testutil.MIGInventory makes them.
func migNode(cards ...[]string) []allocator.Card {
	return allocator.NewCards(testutil.MIGInventory("n", cards...))
}

func migRequest(iso gpuinfo.Isolation, memoryMiB int64) *gpuinfo.PodRequest {
	c := gpuinfo.ContainerRequest{Name: "c", Count: 1, MemoryMiB: memoryMiB}
	if iso == gpuinfo.OwnMIGSlice {
		c.Cores = gpuinfo.FullCores
	}
	return &gpuinfo.PodRequest{Isolation: iso, Containers: []gpuinfo.ContainerRequest{c}}
}

// slice names the slice an assignment gives container c, "CARD:PROFILE@START",
// or the card, "CARD".
func slice(a *gpuinfo.Assignment) string {
	e := a.Containers["c"][0]
	if e.MIG == nil {
		return fmt.Sprint(e.Index)
	}
	return fmt.Sprintf("%d:%s@%d", e.Index, e.MIG.Profile, e.MIG.Start)
}

func TestPlaceOnMIGSlices(t *testing.T) {
	own := func(memoryMiB int64) *gpuinfo.PodRequest { return migRequest(gpuinfo.OwnMIGSlice, memoryMiB) }
	shared := func(memoryMiB int64) *gpuinfo.PodRequest { return migRequest(gpuinfo.MIGSliceShare, memoryMiB) }
	tests := []struct {
		name   string
		cards  [][]string
		held   map[string]int64 // memory held on slices, by "CARD:START"
		req    *gpuinfo.PodRequest
		policy allocator.Policy
		want   string
	}{
		{
			name:  "the smallest slice that holds the request",
			cards: [][]string{{"3g.20gb@0", "2g.10gb@4", "1g.5gb@6"}},
			req:   own(6000), policy: allocator.Binpack,
			want: "0:2g.10gb@4",
		},
		{
			name:  "no memory asked: the smallest slice",
			cards: [][]string{{"3g.20gb@0", "2g.10gb@4", "1g.5gb@6"}},
			req:   own(0), policy: allocator.Spread,
			want: "0:1g.5gb@6",
		},
		{
			name:  "a slice with a share on it is not free",
			cards: [][]string{{"3g.20gb@0", "2g.10gb@4", "1g.5gb@6"}},
			held:  map[string]int64{"0:4": 1024},
			req:   own(6000), policy: allocator.Binpack,
			want: "0:3g.20gb@0",
		},
		{
			name:  "binpack: among equal slices, the fuller card",
			cards: [][]string{{"2g.10gb@0", "2g.10gb@2"}, {"2g.10gb@0", "2g.10gb@2"}},
			held:  map[string]int64{"1:0": 9856},
			req:   own(8000), policy: allocator.Binpack,
			want: "1:2g.10gb@2",
		},
		{
			name:  "spread: among equal slices, the emptier card",
			cards: [][]string{{"2g.10gb@0", "2g.10gb@2"}, {"2g.10gb@0", "2g.10gb@2"}},
			held:  map[string]int64{"0:0": 9856},
			req:   own(8000), policy: allocator.Spread,
			want: "1:2g.10gb@0",
		},
		{
			name:  "shares fill the tightest slice first",
			cards: [][]string{{"3g.20gb@0", "2g.10gb@4"}},
			held:  map[string]int64{"0:4": 4000},
			req:   shared(5000), policy: allocator.FragmentationAware,
			want: "0:2g.10gb@4",
		},
		{
			name:  "a profile asked for by name, though a smaller slice holds it",
			cards: [][]string{{"3g.20gb@0", "2g.10gb@4", "1g.5gb@6"}},
			req:   &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, MIGProfile: "3g.20gb", Containers: migRequest(gpuinfo.OwnMIGSlice, 1000).Containers},
			want:  "0:3g.20gb@0",
		},
		{
			name:  "a plain share skips the card in MIG mode",
			cards: [][]string{{"3g.20gb@0"}, nil},
			req:   &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1024, 10)}},
			want:  "1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cards := migNode(tt.cards...)
			used := make([]allocator.Usage, len(cards))
			for i, c := range cards {
				if c.Slice != nil {
					used[i].MemoryMiB = tt.held[fmt.Sprintf("%d:%d", c.Index, c.Slice.Start)]
				}
			}
			out := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion2, Containers: map[string][]gpuinfo.CardAssignment{}}
			o := allocator.Place(cards, used, nil, tt.req, allocator.Strategy{Policy: tt.policy}, out)
			if !o.Fits {
				t.Fatalf("does not fit: %s", o.Failure.Message(""))
			}
			if got := slice(out); got != tt.want {
				t.Errorf("placed on %s, want %s", got, tt.want)
			}
		})
	}
}

func TestMIGAssignmentEntries(t *testing.T) {
	cards := migNode([]string{"3g.20gb@4", "1g.5gb@0"})
	for _, tt := range []struct {
		name string
		req  *gpuinfo.PodRequest
		want gpuinfo.CardAssignment
	}{
		{"own slice: all its memory, all its compute", migRequest(gpuinfo.OwnMIGSlice, 4000),
			gpuinfo.CardAssignment{Index: 0, UUID: "GPU-n-0", MemoryMiB: 4864, Cores: 100, MIG: &gpuinfo.MIGSlice{Profile: "1g.5gb", Start: 0, UUID: "MIG-n-0-0"}}},
		{"share in a slice: its memory, compute unlimited", migRequest(gpuinfo.MIGSliceShare, 6000),
			gpuinfo.CardAssignment{Index: 0, UUID: "GPU-n-0", MemoryMiB: 6000, Cores: 0, MIG: &gpuinfo.MIGSlice{Profile: "3g.20gb", Start: 4, UUID: "MIG-n-0-4"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion2, Containers: map[string][]gpuinfo.CardAssignment{}}
			if o := allocator.Place(cards, make([]allocator.Usage, len(cards)), nil, tt.req, allocator.Strategy{}, out); !o.Fits {
				t.Fatalf("does not fit: %s", o.Failure.Message(""))
			}
			if diff := cmp.Diff([]gpuinfo.CardAssignment{tt.want}, out.Containers["c"]); diff != "" {
				t.Errorf("entry (-want,+got):\n%s", diff)
			}
			// The ledger's accounting charges exactly the slice.
			charge := allocator.Charge(cards, []gpuinfo.NamedContainer{{Name: "c"}}, out)
			for i, c := range cards {
				chosen := c.Slice != nil && c.Slice.Start == tt.want.MIG.Start
				if (charge[i] != allocator.Usage{}) != chosen {
					t.Errorf("charge on %s = %+v", c.UUID, charge[i])
				}
			}
			if err := out.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestMIGPlacementFailures(t *testing.T) {
	tests := []struct {
		name  string
		cards [][]string
		held  int64 // memory held on every slice
		req   *gpuinfo.PodRequest
		want  string
	}{
		{"no slice large enough", [][]string{{"1g.5gb@0", "2g.10gb@2"}}, 0, migRequest(gpuinfo.OwnMIGSlice, 12000), "no free MIG slice has 12000 MiB"},
		{"no slice free", [][]string{{"1g.5gb@0"}}, 100, migRequest(gpuinfo.OwnMIGSlice, 0), "no MIG slice is free"},
		{"no room in any slice", [][]string{{"1g.5gb@0"}}, 4000, migRequest(gpuinfo.MIGSliceShare, 1000), "no MIG slice has 1000 MiB free"},
		{"MIG asked, no card in MIG mode", [][]string{nil, nil}, 0, migRequest(gpuinfo.OwnMIGSlice, 0), "no GPU in MIG mode with a healthy slice"},
		{"no slice of the profile asked for", [][]string{{"1g.5gb@0"}}, 0, &gpuinfo.PodRequest{Isolation: gpuinfo.OwnMIGSlice, MIGProfile: "2g.10gb", Containers: migRequest(gpuinfo.OwnMIGSlice, 0).Containers},
			"no GPU in MIG mode with a healthy 2g.10gb slice"},
		{"card in MIG mode without slices", [][]string{{}}, 0, migRequest(gpuinfo.OwnMIGSlice, 0), "no GPU in MIG mode with a healthy slice"},
		{"share asked, only slices", [][]string{{"1g.5gb@0"}}, 0, &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1024, 10)}},
			"GPUs in MIG mode (ask for a slice with annotation tessera.io/gpu-isolation)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cards := migNode(tt.cards...)
			used := make([]allocator.Usage, len(cards))
			for i := range cards {
				if cards[i].Slice != nil {
					used[i].MemoryMiB = tt.held
				}
			}
			o := allocator.Place(cards, used, nil, tt.req, allocator.Strategy{Policy: allocator.Binpack}, nil)
			if o.Fits {
				t.Fatal("fits, want a failure")
			}
			if got := o.Failure.Message(""); got != tt.want {
				t.Errorf("failure %q, want %q", got, tt.want)
			}
		})
	}
}

// TestExclusiveNeedsTheMemory: a whole card (or slice) asked for with more
// memory than it has does not fit.
func TestExclusiveNeedsTheMemory(t *testing.T) {
	cards, used := fourCards()
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: 20000, Cores: gpuinfo.FullCores}}}
	if o := allocator.Place(cards, used, nil, req, allocator.Strategy{}, nil); o.Fits {
		t.Error("20000 MiB held whole fits a 16384 MiB card")
	}
}

// dynamicNode is migNode with every card in MIG mode dynamic.
func dynamicNode(cards ...[]string) []allocator.Card {
	inv := testutil.MIGInventory("n", cards...)
	for i := range inv.Cards {
		if inv.Cards[i].MIG != nil {
			inv.Cards[i].MIG.Dynamic = true
		}
	}
	return allocator.NewCards(inv)
}

// placeAll places the requests one after another on the node, each held
// from then on, and returns where each went ("CARD:PROFILE@START"), or
// "pending".
func placeAll(cards []allocator.Card, policy allocator.Policy, reqs ...*gpuinfo.PodRequest) []string {
	used := make([]allocator.Usage, len(cards))
	var got []string
	for _, req := range reqs {
		out := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion2, Containers: map[string][]gpuinfo.CardAssignment{}}
		if o := allocator.Place(cards, used, nil, req, allocator.Strategy{Policy: policy}, out); !o.Fits {
			got = append(got, "pending")
			continue
		}
		got = append(got, slice(out))
		charge := allocator.Charge(cards, []gpuinfo.NamedContainer{{Name: "c"}}, out)
		for i := range used {
			used[i] = allocator.Usage{MemoryMiB: used[i].MemoryMiB + charge[i].MemoryMiB, Cores: used[i].Cores + charge[i].Cores}
		}
	}
	return got
}

// TestDynamicMIGPlacement: on a dynamic card the scheduler chooses the
// profile (the smallest that holds the request) and the placement NVML
// allows that rules out the fewest others, so a sequence that first-fit
// placement would block fits: a 1g.5gb at slot 0 would leave no room for a
// 4g.20gb, which can only start there.
func TestDynamicMIGPlacement(t *testing.T) {
	own := func(memoryMiB int64) *gpuinfo.PodRequest { return migRequest(gpuinfo.OwnMIGSlice, memoryMiB) }
	named := func(profile string) *gpuinfo.PodRequest {
		r := migRequest(gpuinfo.OwnMIGSlice, 0)
		r.MIGProfile = profile
		return r
	}
	tests := []struct {
		name  string
		cards [][]string
		reqs  []*gpuinfo.PodRequest
		want  []string
	}{
		{
			name:  "first-fit would block the 4g.20gb",
			cards: [][]string{{}},
			reqs:  []*gpuinfo.PodRequest{own(4000), named("4g.20gb"), own(9000)},
			want:  []string{"0:1g.5gb@6", "0:4g.20gb@0", "0:1g.10gb@4"},
		},
		{
			name:  "a slice that exists before one to create",
			cards: [][]string{{"3g.20gb@4"}},
			reqs:  []*gpuinfo.PodRequest{own(15000)},
			want:  []string{"0:3g.20gb@4"},
		},
		{
			name:  "slices to create never overlap held ones",
			cards: [][]string{{}},
			reqs:  []*gpuinfo.PodRequest{named("7g.40gb"), own(1000)},
			want:  []string{"0:7g.40gb@0", "pending"},
		},
		{
			name:  "shares fill a slice before another is made",
			cards: [][]string{{}},
			reqs:  []*gpuinfo.PodRequest{migRequest(gpuinfo.MIGSliceShare, 2000), migRequest(gpuinfo.MIGSliceShare, 2000), migRequest(gpuinfo.MIGSliceShare, 2000)},
			want:  []string{"0:1g.5gb@6", "0:1g.5gb@6", "0:1g.5gb@4"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := placeAll(dynamicNode(tt.cards...), allocator.Binpack, tt.reqs...)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("placements (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestFirstFitBlocks is the reference the test above is measured against:
// placing each request at the first start its profile allows, the
// 4g.20gb finds no room.
func TestFirstFitBlocks(t *testing.T) {
	profiles := testutil.MIGInventory("n", []string{}).Cards[0].MIG
	var taken uint32
	firstFit := func(name string) bool {
		p := profiles.Profile(name)
		for _, start := range p.Starts {
			if m := uint32(1<<p.Size-1) << start; m&taken == 0 {
				taken |= m
				return true
			}
		}
		return false
	}
	if !firstFit("1g.5gb") || firstFit("4g.20gb") {
		t.Error("first-fit placed a 1g.5gb and then a 4g.20gb; the test above proves nothing")
	}
}

// TestHoldsRefusesOverlappingSlices: a planned slice to create no longer
// holds once another slice takes one of its slots.
func TestHoldsRefusesOverlappingSlices(t *testing.T) {
	cards := dynamicNode([]string{})
	pos := func(key string) int {
		for i, c := range cards {
			if c.UUID == key {
				return i
			}
		}
		t.Fatalf("no entry %s", key)
		return -1
	}
	plan := make([]allocator.Usage, len(cards))
	plan[pos("GPU-n-0/3g.20gb@0")] = allocator.Usage{MemoryMiB: 19968, Cores: 100}
	used := make([]allocator.Usage, len(cards))
	if !allocator.Holds(cards, used, nil, plan) {
		t.Fatal("the plan does not hold on an empty card")
	}
	used[pos("GPU-n-0/1g.5gb@2")] = allocator.Usage{MemoryMiB: 4864, Cores: 100}
	if allocator.Holds(cards, used, nil, plan) {
		t.Error("the plan holds though a 1g.5gb at slot 2 overlaps it")
	}
}

// BenchmarkPlaceMIG places a slice of its own on a node of eight dynamic
// A100 40GB cards, half of whose slots are held, against the same node's
// cards placed whole (docs/performance.md).
func BenchmarkPlaceMIG(b *testing.B) {
	inv := testutil.MIGInventory("n", []string{"3g.20gb@0"}, []string{"3g.20gb@4"}, []string{}, []string{"2g.10gb@0", "2g.10gb@2"},
		[]string{}, []string{"1g.5gb@6"}, []string{"3g.20gb@0"}, []string{})
	for i := range inv.Cards {
		inv.Cards[i].MIG.Dynamic = true
	}
	for _, tc := range []struct {
		name  string
		cards []allocator.Card
		req   *gpuinfo.PodRequest
	}{
		{"dynamic-slice", allocator.NewCards(inv), migRequest(gpuinfo.OwnMIGSlice, 9000)},
		{"whole-cards-share", allocator.NewCards(testutil.Inventory("w", "A100", 40960, 8)), &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 9000, 30)}}},
	} {
		used := make([]allocator.Usage, len(tc.cards))
		for i, c := range tc.cards {
			if c.Slice != nil && c.Slice.Exists() {
				used[i] = c.Capacity // the slices that exist are held
			}
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if o := allocator.Place(tc.cards, used, nil, tc.req, allocator.Strategy{Policy: allocator.Binpack}, nil); !o.Fits {
					b.Fatal("does not fit")
				}
			}
		})
	}
}

// h100Profiles are an H100 80GB's plain MIG profiles, placements as NVIDIA's
// MIG user guide lists them (memory as go-nvml's mock reports it).
var h100Profiles = []gpuinfo.MIGProfile{
	{Name: "1g.10gb", Slices: 1, Size: 1, MemoryMiB: 10240, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
	{Name: "1g.20gb", Slices: 1, Size: 2, MemoryMiB: 20480, Starts: []int{0, 2, 4, 6}},
	{Name: "2g.20gb", Slices: 2, Size: 2, MemoryMiB: 20480, Starts: []int{0, 2, 4}},
	{Name: "3g.40gb", Slices: 3, Size: 4, MemoryMiB: 40960, Starts: []int{0, 4}},
	{Name: "4g.40gb", Slices: 4, Size: 4, MemoryMiB: 40960, Starts: []int{0}},
	{Name: "7g.80gb", Slices: 7, Size: 8, MemoryMiB: 81920, Starts: []int{0}},
}

// TestDynamicMIGPlacementH100: the same rules on an H100's profiles: among
// equal memory the fewest compute slices (1g.20gb before 2g.20gb), placed
// where it rules out the fewest others (slot 6), so that the 4g.40gb, which
// starts only at 0, still fits; then a 1g.10gb in what is left, and no room
// for a 3g.40gb.
func TestDynamicMIGPlacementH100(t *testing.T) {
	inv := testutil.Inventory("h", "NVIDIA H100 80GB HBM3", 81920, 1)
	inv.Version = gpuinfo.InventoryVersion2
	inv.Cards[0].MIGEnabled = true
	inv.Cards[0].MIG = &gpuinfo.MIG{Dynamic: true, Slots: 8, Profiles: h100Profiles, Instances: []gpuinfo.MIGInstance{}}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	named := func(profile string) *gpuinfo.PodRequest {
		r := migRequest(gpuinfo.OwnMIGSlice, 0)
		r.MIGProfile = profile
		return r
	}
	got := placeAll(allocator.NewCards(inv), allocator.Binpack,
		migRequest(gpuinfo.OwnMIGSlice, 15000), named("4g.40gb"), migRequest(gpuinfo.OwnMIGSlice, 9000), named("3g.40gb"))
	want := []string{"0:1g.20gb@6", "0:4g.40gb@0", "0:1g.10gb@4", "pending"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placements (-want,+got):\n%s", diff)
	}
}
