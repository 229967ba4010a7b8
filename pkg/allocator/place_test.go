package allocator_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func share(name string, kind gpuinfo.ContainerKind, count int, memoryMiB, cores int64) gpuinfo.ContainerRequest {
	return gpuinfo.ContainerRequest{Name: name, Kind: kind, Count: count, MemoryMiB: memoryMiB, Cores: cores}
}

func order(req *gpuinfo.PodRequest) []gpuinfo.NamedContainer {
	var o []gpuinfo.NamedContainer
	for _, c := range req.Containers {
		o = append(o, gpuinfo.NamedContainer{Name: c.Name, Kind: c.Kind})
	}
	return o
}

// fourCards is a node of four 16 GiB cards; used is what each holds already.
func fourCards(used ...allocator.Usage) ([]allocator.Card, []allocator.Usage) {
	cards := allocator.NewCards(testutil.Inventory("n", "Tesla T4", 16384, 4))
	u := make([]allocator.Usage, len(cards))
	copy(u, used)
	return cards, u
}

func TestPlaceChoosesCards(t *testing.T) {
	half := allocator.Usage{MemoryMiB: 8192, Cores: 50}
	quarter := allocator.Usage{MemoryMiB: 4096, Cores: 25}
	tests := []struct {
		name   string
		used   []allocator.Usage
		req    gpuinfo.PodRequest
		policy allocator.Policy
		want   map[string][]int
	}{
		{
			name:   "binpack takes the tightest fit",
			used:   []allocator.Usage{quarter, half, {}, {}},
			req:    gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 4096, 30)}},
			policy: allocator.Binpack,
			want:   map[string][]int{"c": {1}},
		},
		{
			name:   "spread takes the least used",
			used:   []allocator.Usage{quarter, half, {}, {}},
			req:    gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 4096, 30)}},
			policy: allocator.Spread,
			want:   map[string][]int{"c": {2}},
		},
		{
			name:   "multi-card containers get distinct cards",
			used:   []allocator.Usage{half, {}, {}, {}},
			req:    gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 3, 4096, 10)}},
			policy: allocator.Binpack,
			want:   map[string][]int{"c": {0, 1, 2}},
		},
		{
			name:   "whole cards need empty cards",
			used:   []allocator.Usage{quarter, {}, quarter, {}},
			req:    gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 2, Cores: 100}}},
			policy: allocator.Binpack,
			want:   map[string][]int{"c": {1, 3}},
		},
		{
			name: "two app containers add up on one card",
			used: []allocator.Usage{{MemoryMiB: 16384 - 8192, Cores: 0}, {}, {}, {}},
			req: gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
				share("a", gpuinfo.AppContainer, 1, 4096, 0), share("b", gpuinfo.AppContainer, 1, 4096, 0),
			}},
			policy: allocator.Binpack,
			want:   map[string][]int{"a": {0}, "b": {0}},
		},
		{
			name: "an init container reuses the app container's card",
			used: []allocator.Usage{{MemoryMiB: 16384 - 8192}, {}, {}, {}},
			req: gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
				share("init", gpuinfo.InitContainer, 1, 8192, 0), share("app", gpuinfo.AppContainer, 1, 8192, 0),
			}},
			policy: allocator.Binpack,
			want:   map[string][]int{"init": {0}, "app": {0}},
		},
		{
			name: "a sidecar adds to the app container",
			used: []allocator.Usage{{MemoryMiB: 16384 - 8192}, {}, {}, {}},
			req: gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
				share("side", gpuinfo.SidecarContainer, 1, 8192, 0), share("app", gpuinfo.AppContainer, 1, 8192, 0),
			}},
			policy: allocator.Binpack,
			want:   map[string][]int{"side": {0}, "app": {1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cards, used := fourCards(tc.used...)
			a := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{}}
			out := allocator.Place(cards, used, nil, &tc.req, allocator.Strategy{Policy: tc.policy}, a)
			if !out.Fits {
				t.Fatalf("pod does not fit: %s", out.Failure.Message(""))
			}
			got := map[string][]int{}
			for name, entries := range a.Containers {
				for _, e := range entries {
					got[name] = append(got[name], e.Index)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cards (-want,+got):\n%s", diff)
			}
			// Filter's answer (no output) must agree with Reserve's.
			if again := allocator.Place(cards, used, nil, &tc.req, allocator.Strategy{Policy: tc.policy}, nil); again != out {
				t.Errorf("Place without output = %+v, with output = %+v", again, out)
			}
		})
	}
}

func TestPlaceIsDeterministic(t *testing.T) {
	cards, used := fourCards()
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 2, 1000, 10)}}
	var first *gpuinfo.Assignment
	for i := 0; i < 20; i++ {
		a := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{}}
		allocator.Place(cards, used, nil, req, allocator.Strategy{Policy: allocator.Binpack}, a)
		if first == nil {
			first = a
		} else if diff := cmp.Diff(first, a); diff != "" {
			t.Fatalf("run %d differs (-first,+now):\n%s", i, diff)
		}
	}
}

func TestPlaceFailures(t *testing.T) {
	full := allocator.Usage{MemoryMiB: 16384 - 6144, Cores: 20}
	tests := []struct {
		name      string
		used      []allocator.Usage
		unhealthy bool
		req       gpuinfo.PodRequest
		wantKind  allocator.FailureKind
		wantMsg   string
		// wantMostFree and wantFit are the figures the summary reports.
		wantMostFree allocator.Usage
		wantFit      int
	}{
		{
			name:         "not enough memory anywhere",
			used:         []allocator.Usage{full, full, full, full},
			req:          gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 8192, 0)}},
			wantKind:     allocator.NoCapacity,
			wantMsg:      "no GPU has 8192 MiB free",
			wantMostFree: allocator.Usage{MemoryMiB: 6144, Cores: 80},
		},
		{
			name:         "not enough compute anywhere",
			used:         []allocator.Usage{{Cores: 80}, {Cores: 80}, {Cores: 90}, {Cores: 90}},
			req:          gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1024, 30)}},
			wantKind:     allocator.NoCapacity,
			wantMsg:      "no GPU has 30% compute free",
			wantMostFree: allocator.Usage{MemoryMiB: 16384, Cores: 20},
		},
		{
			name:     "too few cards",
			used:     []allocator.Usage{{}, {}, {}, full},
			req:      gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 4, 8192, 0)}},
			wantKind: allocator.TooFewCards,
			wantMsg:  "fewer than 4 GPUs have room",
			wantFit:  3,
		},
		{
			name:     "no card is entirely free",
			used:     []allocator.Usage{{MemoryMiB: 1}, {Cores: 1}, {MemoryMiB: 1}, {MemoryMiB: 1}},
			req:      gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, Cores: 100}}},
			wantKind: allocator.NoCapacity,
			wantMsg:  "no GPU is entirely free",
		},
		{
			name: "no card matches the model",
			req: gpuinfo.PodRequest{
				Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1, 0)},
				Selector:   gpuinfo.Selector{Models: []string{"a100"}},
			},
			wantKind: allocator.NoMatchingCard,
			wantMsg:  "no GPU matches model a100",
		},
		{
			name:      "no healthy card",
			unhealthy: true,
			req:       gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1, 0)}},
			wantKind:  allocator.NoHealthyCard,
			wantMsg:   "no healthy GPU",
		},
		{
			name: "a sidecar and an app container cannot share what only one fits",
			used: []allocator.Usage{full, full, full, {MemoryMiB: 16384 - 8192}},
			req: gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
				share("side", gpuinfo.SidecarContainer, 1, 8192, 0), share("app", gpuinfo.AppContainer, 1, 8192, 0),
			}},
			wantKind:     allocator.NoCapacity,
			wantMsg:      "no GPU has 8192 MiB free",
			wantMostFree: allocator.Usage{MemoryMiB: 6144, Cores: 100},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cards, used := fourCards(tc.used...)
			if tc.unhealthy {
				for i := range cards {
					cards[i].Healthy = false
				}
			}
			out := allocator.Place(cards, used, nil, &tc.req, allocator.Strategy{Policy: allocator.Binpack}, nil)
			if out.Fits {
				t.Fatal("pod fits, want a failure")
			}
			if out.Failure.Kind != tc.wantKind {
				t.Errorf("kind = %d, want %d", out.Failure.Kind, tc.wantKind)
			}
			if got := out.Failure.Message(tc.req.Selector.String()); got != tc.wantMsg {
				t.Errorf("message = %q, want %q", got, tc.wantMsg)
			}
			if tc.wantMostFree != (allocator.Usage{}) && out.Failure.MostFree != tc.wantMostFree {
				t.Errorf("most free = %+v, want %+v", out.Failure.MostFree, tc.wantMostFree)
			}
			if out.Failure.Fit != tc.wantFit {
				t.Errorf("fit = %d, want %d", out.Failure.Fit, tc.wantFit)
			}
		})
	}
}

func TestDeltasAdjustUsage(t *testing.T) {
	cards, used := fourCards()
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 4, Cores: 100}}}
	if out := allocator.Place(cards, used, nil, req, allocator.Strategy{Policy: allocator.Binpack}, nil); !out.Fits {
		t.Fatal("four whole cards do not fit an empty node")
	}
	deltas := []allocator.Delta{{UUID: cards[2].UUID, Usage: allocator.Usage{MemoryMiB: 1}}}
	if out := allocator.Place(cards, used, deltas, req, allocator.Strategy{Policy: allocator.Binpack}, nil); out.Fits {
		t.Error("a delta on card 2 was ignored")
	}
}

func TestChargeMatchesPlacement(t *testing.T) {
	tests := []struct {
		name string
		req  gpuinfo.PodRequest
	}{
		{"app only", gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("a", gpuinfo.AppContainer, 2, 4096, 20)}}},
		{"init larger than app", gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
			share("i", gpuinfo.InitContainer, 1, 12000, 50), share("a", gpuinfo.AppContainer, 1, 4096, 20)}}},
		{"sidecar, init, app", gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{
			share("s", gpuinfo.SidecarContainer, 1, 2000, 10), share("i", gpuinfo.InitContainer, 2, 9000, 40),
			share("a", gpuinfo.AppContainer, 1, 3000, 30), {Name: "w", Kind: gpuinfo.AppContainer, Count: 1, Cores: 100}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cards, used := fourCards(allocator.Usage{MemoryMiB: 1000, Cores: 10})
			a := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{}}
			out := allocator.Place(cards, used, nil, &tc.req, allocator.Strategy{Policy: allocator.Binpack}, a)
			if !out.Fits {
				t.Fatalf("does not fit: %s", out.Failure.Message(""))
			}
			charge := allocator.Charge(cards, order(&tc.req), a)
			var capMem, capCores, usedMem, usedCores int64
			for i := range cards {
				total := allocator.Usage{MemoryMiB: used[i].MemoryMiB + charge[i].MemoryMiB, Cores: used[i].Cores + charge[i].Cores}
				if total.MemoryMiB > cards[i].Capacity.MemoryMiB || total.Cores > cards[i].Capacity.Cores {
					t.Errorf("card %d over-committed: %+v of %+v", i, total, cards[i].Capacity)
				}
				capMem, capCores = capMem+cards[i].Capacity.MemoryMiB, capCores+cards[i].Capacity.Cores
				usedMem, usedCores = usedMem+total.MemoryMiB, usedCores+total.Cores
			}
			if want := (usedMem*1000/capMem + usedCores*1000/capCores) / 2; out.UsedPermille != want {
				t.Errorf("UsedPermille = %d, the charge says %d", out.UsedPermille, want)
			}
		})
	}
}

// TestMIGCardsGetNoPods: a card in MIG mode is passed over, and a node whose
// matching cards are all in MIG mode says so.
func TestMIGCardsGetNoPods(t *testing.T) {
	inv := testutil.Inventory("n", "A100", 81920, 2)
	inv.Cards[0].MIGEnabled = true
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1024, 10)}}
	out := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{}}
	if o := allocator.Place(allocator.NewCards(inv), make([]allocator.Usage, 2), nil, req, allocator.Strategy{Policy: allocator.Binpack}, out); !o.Fits || out.Containers["c"][0].Index != 1 {
		t.Fatalf("placed %+v (fits %v), want card 1, the one not in MIG mode", out.Containers, o.Fits)
	}
	inv.Cards[1].MIGEnabled = true
	o := allocator.Place(allocator.NewCards(inv), make([]allocator.Usage, 2), nil, req, allocator.Strategy{Policy: allocator.Binpack}, nil)
	if o.Fits || o.Failure.Kind != allocator.InMIGMode || o.Failure.Message("") != "GPUs in MIG mode (ask for a slice with annotation tessera.io/gpu-isolation)" {
		t.Errorf("on a node of MIG cards: fits %v, failure %+v %q", o.Fits, o.Failure, o.Failure.Message(""))
	}
}

// TestReserve: a pod must leave Strategy.Reserve entirely free cards free:
// it takes room elsewhere when there is some, counts free cards it could not
// use anyway, and fails with Reserved only when the reservation is what
// keeps it out.
func TestReserve(t *testing.T) {
	whole := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, Cores: gpuinfo.FullCores}}}
	small := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 1024, 10)}}
	onA100 := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 2, Cores: gpuinfo.FullCores}}, Selector: gpuinfo.Selector{Models: []string{"a100"}}}
	mixed := testutil.Inventory("n", "T4", 16384, 4)
	mixed.Cards[2].Model, mixed.Cards[3].Model = "A100", "A100"
	for _, tc := range []struct {
		name     string
		inv      *gpuinfo.Inventory
		used     []allocator.Usage
		req      *gpuinfo.PodRequest
		reserve  int
		wantKind allocator.FailureKind // 0: fits
		wantCard int
	}{
		{name: "whole card beside two reserved", inv: testutil.Inventory("n", "A100", 81920, 4), used: make([]allocator.Usage, 4), req: whole, reserve: 2, wantCard: 0},
		{name: "the reserved cards stay free", inv: testutil.Inventory("n", "A100", 81920, 4), used: []allocator.Usage{{Cores: 100, MemoryMiB: 81920}, {Cores: 100, MemoryMiB: 81920}, {}, {}}, req: whole, reserve: 2, wantKind: allocator.Reserved},
		{name: "a share goes to a used card", inv: testutil.Inventory("n", "A100", 81920, 4), used: []allocator.Usage{{}, {}, {MemoryMiB: 1024}, {}}, req: small, reserve: 3, wantCard: 2},
		{name: "nothing but reserved cards", inv: testutil.Inventory("n", "A100", 81920, 4), used: make([]allocator.Usage, 4), req: small, reserve: 4, wantKind: allocator.Reserved},
		{name: "free cards the pod cannot use count as kept", inv: mixed, used: make([]allocator.Usage, 4), req: onA100, reserve: 2, wantCard: 2},
		{name: "too large anyway: the node's own reason", inv: testutil.Inventory("n", "A100", 81920, 4), used: []allocator.Usage{{}, {}, {}, {}}, req: &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 1, 90000, 0)}}, reserve: 1, wantKind: allocator.NoCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{}}
			o := allocator.Place(allocator.NewCards(tc.inv), tc.used, nil, tc.req, allocator.Strategy{Policy: allocator.Binpack, Reserve: tc.reserve}, out)
			if tc.wantKind != 0 {
				if o.Fits || o.Failure.Kind != tc.wantKind {
					t.Fatalf("fits %v, failure %+v; want failure kind %d", o.Fits, o.Failure, tc.wantKind)
				}
				return
			}
			if !o.Fits || out.Containers["c"][0].Index != tc.wantCard {
				t.Fatalf("fits %v (%+v), placed %+v; want card %d first", o.Fits, o.Failure, out.Containers["c"], tc.wantCard)
			}
		})
	}
}
