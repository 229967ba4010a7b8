package allocator_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// shaped is a node of n 80 GiB cards of the shape; used[i] is what card i
// holds already.
func shaped(shape string, n int, used map[int]allocator.Usage) ([]allocator.Card, []allocator.Usage) {
	inv := testutil.Inventory("n", "NVIDIA H100 80GB HBM3", 81920, n)
	topology.Apply(inv, shape)
	cards := allocator.NewCards(inv)
	u := make([]allocator.Usage, len(cards))
	for i, v := range used {
		u[i] = v
	}
	return cards, u
}

// wholeCards asks for count whole cards in one container.
func wholeCards(count int) gpuinfo.PodRequest {
	return gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: count, Cores: gpuinfo.FullCores}}}
}

var (
	whole = allocator.Usage{MemoryMiB: 81920, Cores: 100}
	half  = allocator.Usage{MemoryMiB: 40960, Cores: 50}
)

func TestPlaceChoosesLinkedCards(t *testing.T) {
	sharesOf := func(count int) gpuinfo.PodRequest {
		return gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, count, 20480, 20)}}
	}
	tests := []struct {
		name     string
		shape    string
		n        int
		used     map[int]allocator.Usage
		req      gpuinfo.PodRequest
		policy   allocator.Policy
		want     []int
		wantLink gpuinfo.LinkClass
	}{
		{
			name: "nvswitch: binpack's cards, all on NVLink", shape: topology.NVSwitch, n: 8,
			used: map[int]allocator.Usage{2: half, 5: half, 6: half}, req: sharesOf(3), policy: allocator.Binpack,
			want: []int{2, 5, 6}, wantLink: gpuinfo.LinkNVLink,
		},
		{
			name: "nvswitch: eight whole cards", shape: topology.NVSwitch, n: 8,
			req: wholeCards(8), policy: allocator.Binpack, want: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantLink: gpuinfo.LinkNVLink,
		},
		{
			name: "quads: four cards on the free quad, not the first four free", shape: topology.NVLinkQuads, n: 8,
			used: map[int]allocator.Usage{0: half}, req: wholeCards(4), policy: allocator.Binpack,
			want: []int{4, 5, 6, 7}, wantLink: gpuinfo.LinkNVLink,
		},
		{
			name: "quads: spread keeps the quad too", shape: topology.NVLinkQuads, n: 8,
			used: map[int]allocator.Usage{5: half}, req: wholeCards(4), policy: allocator.Spread,
			want: []int{0, 1, 2, 3}, wantLink: gpuinfo.LinkNVLink,
		},
		{
			name: "quads: two cards inside the broken quad, the whole quad left", shape: topology.NVLinkQuads, n: 8,
			used: map[int]allocator.Usage{4: whole, 5: whole}, req: wholeCards(2), policy: allocator.Binpack,
			want: []int{6, 7}, wantLink: gpuinfo.LinkNVLink,
		},
		{
			name: "quads: one card from the broken quad (look-ahead)", shape: topology.NVLinkQuads, n: 8,
			used: map[int]allocator.Usage{7: whole}, req: wholeCards(1), policy: allocator.Binpack,
			want: []int{4}, wantLink: gpuinfo.NumLinkClasses,
		},
		{
			name: "quads: binpack's tightest card still first", shape: topology.NVLinkQuads, n: 8,
			used: map[int]allocator.Usage{1: half, 7: whole}, req: sharesOf(1), policy: allocator.Binpack,
			want: []int{1}, wantLink: gpuinfo.NumLinkClasses,
		},
		{
			name: "quads: five cards, a quad and one", shape: topology.NVLinkQuads, n: 8,
			req: wholeCards(5), policy: allocator.Binpack, want: []int{0, 1, 2, 3, 4}, wantLink: gpuinfo.LinkSystem,
		},
		{
			name: "pcie: a pair behind one switch", shape: topology.PCIeSockets, n: 4,
			used: map[int]allocator.Usage{0: half}, req: wholeCards(2), policy: allocator.Binpack,
			want: []int{2, 3}, wantLink: gpuinfo.LinkPCIeSwitch,
		},
		{
			name: "pcie: shares on the pair binpack fills", shape: topology.PCIeSockets, n: 4,
			used: map[int]allocator.Usage{0: half, 3: half}, req: sharesOf(2), policy: allocator.Binpack,
			want: []int{0, 1}, wantLink: gpuinfo.LinkPCIeSwitch,
		},
		{
			name: "pcie: across the sockets when nothing better is free", shape: topology.PCIeSockets, n: 4,
			used: map[int]allocator.Usage{0: whole, 3: whole}, req: wholeCards(2), policy: allocator.Binpack,
			want: []int{1, 2}, wantLink: gpuinfo.LinkSystem,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cards, used := shaped(tc.shape, tc.n, tc.used)
			a := &gpuinfo.Assignment{Containers: map[string][]gpuinfo.CardAssignment{}}
			out := allocator.Place(cards, used, nil, &tc.req, allocator.Strategy{Policy: tc.policy}, a)
			if !out.Fits {
				t.Fatalf("does not fit: %s", out.Failure.Message(""))
			}
			var got []int
			for _, e := range a.Containers["c"] {
				got = append(got, e.Index)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cards (-want,+got):\n%s", diff)
			}
			if out.Link != tc.wantLink {
				t.Errorf("link = %v, want %v", out.Link, tc.wantLink)
			}
		})
	}
}

func TestPlaceRequiredTopology(t *testing.T) {
	tests := []struct {
		name     string
		shape    string
		used     map[int]allocator.Usage
		count    int
		required gpuinfo.LinkClass
		wantFail allocator.FailureKind
		wantMsg  string
	}{
		{name: "nvlink quad free", shape: topology.NVLinkQuads, used: map[int]allocator.Usage{0: whole}, count: 4, required: gpuinfo.LinkNVLink},
		{name: "no nvlink quad free", shape: topology.NVLinkQuads, used: map[int]allocator.Usage{0: whole, 4: whole}, count: 4,
			required: gpuinfo.LinkNVLink, wantFail: allocator.NoLinkedSet, wantMsg: "no 4 free GPUs linked by nvlink"},
		{name: "preferred takes what is free", shape: topology.NVLinkQuads, used: map[int]allocator.Usage{0: whole, 4: whole}, count: 4},
		{name: "too few cards is not a link failure", shape: topology.NVLinkQuads, used: map[int]allocator.Usage{0: whole, 1: whole, 4: whole, 5: whole, 6: whole}, count: 4,
			required: gpuinfo.LinkNVLink, wantFail: allocator.TooFewCards, wantMsg: "fewer than 4 GPUs have room"},
		{name: "numa node within a socket", shape: topology.PCIeSockets, used: map[int]allocator.Usage{}, count: 2, required: gpuinfo.LinkNUMANode},
		{name: "numa node, only across sockets", shape: topology.PCIeSockets, used: map[int]allocator.Usage{0: whole, 3: whole}, count: 2,
			required: gpuinfo.LinkNUMANode, wantFail: allocator.NoLinkedSet, wantMsg: "no 2 free GPUs linked by numa-node"},
		{name: "no topology reported", count: 2, required: gpuinfo.LinkPCIeBridges,
			wantFail: allocator.NoTopology, wantMsg: "node reports no GPU topology (tessera.io/gpu-topology: pcie-switch)"},
		{name: "no topology, one card needs none", count: 1, required: gpuinfo.LinkNVLink},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cards []allocator.Card
			var used []allocator.Usage
			if tc.shape == "" {
				cards, used = fourCards()
			} else {
				n := 8
				if tc.shape == topology.PCIeSockets {
					n = 4
				}
				cards, used = shaped(tc.shape, n, tc.used)
			}
			req := wholeCards(tc.count)
			req.Topology = tc.required
			out := allocator.Place(cards, used, nil, &req, allocator.Strategy{Policy: allocator.Binpack}, nil)
			if out.Fits != (tc.wantFail == 0) || out.Failure.Kind != tc.wantFail {
				t.Fatalf("fits %v, failure %d (%s); want failure %d", out.Fits, out.Failure.Kind, out.Failure.Message(""), tc.wantFail)
			}
			if got := out.Failure.Message(""); tc.wantFail != 0 && got != tc.wantMsg {
				t.Errorf("message = %q, want %q", got, tc.wantMsg)
			}
		})
	}
}

// TestPlaceNeverMissesTheBestSet compares, on random link matrices and
// servers' shapes with random usage, the set Place chooses with the best one an exhaustive search over
// all sets finds, working from the inventory's letters: the same worst link
// and link sum, and a required class met exactly when some set meets it.
func TestPlaceNeverMissesTheBestSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(34, 1))
	for trial := range 3000 {
		n := 2 + rng.IntN(9)
		inv := testutil.Inventory("n", "T", 1000, n)
		letters := make([]byte, gpuinfo.LinkPairs(n))
		for i := range letters {
			letters[i] = gpuinfo.LinkLetters[rng.IntN(len(gpuinfo.LinkLetters))]
		}
		inv.Links, inv.Version = string(letters), gpuinfo.InventoryVersion2
		if rng.IntN(2) == 0 {
			// A server's shape, whose many interchangeable cards the
			// search takes once.
			topology.Apply(inv, topology.Shapes[rng.IntN(len(topology.Shapes))])
		}
		cards := allocator.NewCards(inv)
		used := make([]allocator.Usage, n)
		for i := range used {
			if rng.IntN(3) == 0 {
				used[i] = allocator.Usage{MemoryMiB: int64(rng.IntN(1001)), Cores: int64(rng.IntN(101))}
			}
		}
		c := gpuinfo.ContainerRequest{Name: "c", Count: 2 + rng.IntN(n-1), MemoryMiB: int64(1 + rng.IntN(600)), Cores: int64(rng.IntN(60))}
		if rng.IntN(3) == 0 {
			c.MemoryMiB, c.Cores = 0, gpuinfo.FullCores
		}
		req := gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{c}, Topology: gpuinfo.LinkClass(rng.IntN(int(gpuinfo.LinkNVLink) + 1))}
		policy := allocator.Policy(rng.IntN(2))
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			bestWorst, bestSum, any := bestSet(inv, used, &c, req.Topology)
			a := &gpuinfo.Assignment{Containers: map[string][]gpuinfo.CardAssignment{}}
			out := allocator.Place(cards, used, nil, &req, allocator.Strategy{Policy: policy}, a)
			if out.Fits != any {
				t.Fatalf("fits = %v (%s), exhaustive search finds a set: %v (links %s, used %v, %+v)", out.Fits, out.Failure.Message(""), any, inv.Links, used, c)
			}
			if !any {
				return
			}
			worst, sum := setLinks(inv, a.Containers["c"])
			if worst != out.Link || sum != out.LinkSum {
				t.Errorf("outcome reports link %v sum %d, the set has %v and %d", out.Link, out.LinkSum, worst, sum)
			}
			if worst != bestWorst || sum != bestSum {
				t.Errorf("set %v has worst link %v, sum %d; the best has %v, %d (links %s, used %v, %+v)", a.Containers["c"], worst, sum, bestWorst, bestSum, inv.Links, used, c)
			}
		})
	}
}

// bestSet searches every set of c.Count cards with room for c for the best
// worst link, then the best link sum, among those whose links are all at
// least required.
func bestSet(inv *gpuinfo.Inventory, used []allocator.Usage, c *gpuinfo.ContainerRequest, required gpuinfo.LinkClass) (gpuinfo.LinkClass, int, bool) {
	var room []int
	for i, card := range inv.Cards {
		freeMem, freeCores := card.MemoryMiB-used[i].MemoryMiB, card.Cores-used[i].Cores
		if c.Exclusive() && used[i] == (allocator.Usage{}) || !c.Exclusive() && freeMem >= max(c.MemoryMiB, 1) && freeCores >= c.Cores {
			room = append(room, i)
		}
	}
	var bestWorst gpuinfo.LinkClass
	bestSum, found := -1, false
	for mask := 0; mask < 1<<len(room); mask++ {
		var set []int
		for b, i := range room {
			if mask&(1<<b) != 0 {
				set = append(set, i)
			}
		}
		if len(set) != c.Count {
			continue
		}
		worst, sum := gpuinfo.NumLinkClasses, 0
		for x := range set {
			for y := x + 1; y < len(set); y++ {
				l := inv.Link(set[x], set[y])
				worst, sum = min(worst, l), sum+int(l)
			}
		}
		if worst < required {
			continue
		}
		if !found || worst > bestWorst || worst == bestWorst && sum > bestSum {
			bestWorst, bestSum, found = worst, sum, true
		}
	}
	return bestWorst, bestSum, found
}

// setLinks is the worst link and the link sum of the cards assigned.
func setLinks(inv *gpuinfo.Inventory, entries []gpuinfo.CardAssignment) (gpuinfo.LinkClass, int) {
	worst, sum := gpuinfo.NumLinkClasses, 0
	var idx []int
	for _, e := range entries {
		idx = append(idx, e.Index)
	}
	slices.Sort(idx)
	for x := range idx {
		for y := x + 1; y < len(idx); y++ {
			l := inv.Link(idx[x], idx[y])
			worst, sum = min(worst, l), sum+int(l)
		}
	}
	return worst, sum
}

// BenchmarkPlaceSet places multi-card containers on nodes with links, the
// set search's cost: 4 and 2 cards of 8 in two NVLink quads with some cards
// in use, 8 of 16 on NVSwitch (the largest exact search), and one card with
// the look-ahead.
func BenchmarkPlaceSet(b *testing.B) {
	for _, bc := range []struct {
		name  string
		shape string
		n     int
		req   gpuinfo.PodRequest
	}{
		{"quads/4 of 8", topology.NVLinkQuads, 8, wholeCards(4)},
		{"quads/2 shares of 8", topology.NVLinkQuads, 8, gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{share("c", gpuinfo.AppContainer, 2, 20480, 20)}}},
		{"nvswitch/8 of 16", topology.NVSwitch, 16, wholeCards(8)},
		{"quads/1 of 8, look-ahead", topology.NVLinkQuads, 8, wholeCards(1)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cards, used := shaped(bc.shape, bc.n, map[int]allocator.Usage{1: half, 6: half})
			st := allocator.Strategy{Policy: allocator.Binpack}
			b.ReportAllocs()
			for b.Loop() {
				if out := allocator.Place(cards, used, nil, &bc.req, st, nil); !out.Fits {
					b.Fatal("does not fit")
				}
			}
		})
	}
}
