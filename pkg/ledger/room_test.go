package ledger

import (
	"math/rand"
	"testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestMayHoldNeverRulesOutAFit: on random nodes (card sizes, health, usage)
// and random one-container requests, whenever the allocator places the pod,
// MayHold says the node may hold it — pruning only removes nodes Filter
// would reject. It also checks that it does rule nodes out.
func TestMayHoldNeverRulesOutAFit(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	sizes := []int64{999, 15360, 16384, 23034, 81920}
	ruledOut := 0
	for i := 0; i < 20000; i++ {
		inv := testutil.Inventory("n", "Card", sizes[r.Intn(len(sizes))], 1+r.Intn(8))
		for j := range inv.Cards {
			inv.Cards[j].Healthy = r.Intn(10) > 0
		}
		n := &node{cards: allocator.NewCards(inv)}
		n.used = make([]allocator.Usage, len(n.cards))
		for j, c := range n.cards {
			switch r.Intn(3) {
			case 1:
				n.used[j] = c.Capacity
			case 2:
				n.used[j] = allocator.Usage{MemoryMiB: r.Int63n(c.Capacity.MemoryMiB + 1), Cores: r.Int63n(101)}
			}
		}
		n.summarize()
		c := gpuinfo.ContainerRequest{Name: "c", Kind: gpuinfo.AppContainer, Count: 1 + r.Intn(3)}
		switch r.Intn(4) {
		case 0:
			c.Cores = gpuinfo.FullCores
		case 1:
			c.MemoryMiB, c.Cores = 1+r.Int63n(40000), r.Int63n(101)
		case 2:
			c.MemoryPercent, c.Cores = 1+r.Int63n(100), r.Int63n(101)
		case 3:
			c.Cores = r.Int63n(100)
		}
		req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{c}}
		fits := allocator.Place(n.cards, n.used, nil, req, allocator.Strategy{Policy: allocator.Binpack}, nil).Fits
		may := n.room.mayHold(&c)
		if fits && !may {
			t.Fatalf("request %+v fits cards %+v used %+v, but MayHold rules the node out (room %+v)", c, n.cards, n.used, n.room)
		}
		if !may {
			ruledOut++
		}
	}
	if ruledOut == 0 {
		t.Error("MayHold never ruled a node out")
	}
	t.Logf("ruled out %d of 20000 nodes", ruledOut)
}
