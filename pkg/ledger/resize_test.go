package ledger_test

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

var mainOnly = []gpuinfo.NamedContainer{{Name: "main", Kind: gpuinfo.AppContainer}}

// share is an assignment of container main to card index of node n with
// the given share.
func share(index int, memoryMiB, cores int64) *gpuinfo.Assignment {
	return &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{
		"main": {{Index: index, UUID: fmt.Sprintf("GPU-n-%d", index), MemoryMiB: memoryMiB, Cores: cores}},
	}}
}

// card0 is what the snapshot says of card 0 of node n.
func card0(t *testing.T, l *ledger.Ledger) allocator.Usage {
	t.Helper()
	return l.Snapshot()["n"][0].Used
}

// TestResize: a grow holds its room from the moment it is recorded, older
// annotations do not undo it, the annotation that says it takes over, and a
// resize that failed is forgotten; a grow beyond the card's free room, or
// into room a nominated pod will take, is refused naming the card.
func TestResize(t *testing.T) {
	newLedger := func() *ledger.Ledger {
		l := ledger.New()
		l.SetNode(inventoryNode("n", "1", testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 2))))
		l.AddPod("notebook", "n", mainOnly, share(0, 4096, 30), false)
		l.AddPod("other", "n", mainOnly, share(0, 8192, 40), false)
		return l
	}
	t.Run("grow, then the annotation says it", func(t *testing.T) {
		l := newLedger()
		if err := l.Resize("notebook", share(0, 8192, 50), nil); err != nil {
			t.Fatal(err)
		}
		want := allocator.Usage{MemoryMiB: 8192 + 8192, Cores: 50 + 40}
		if diff := gocmp.Diff(want, card0(t, l)); diff != "" {
			t.Errorf("card 0 after the grow (-want,+got):\n%s", diff)
		}
		// An update of the pod from before the annotation was written.
		l.AddPod("notebook", "n", mainOnly, share(0, 4096, 30), false)
		if diff := gocmp.Diff(want, card0(t, l)); diff != "" {
			t.Errorf("card 0 after an older annotation (-want,+got):\n%s", diff)
		}
		l.AddPod("notebook", "n", mainOnly, share(0, 8192, 50), false)
		l.ForgetResize("notebook") // recorded: nothing to forget
		if diff := gocmp.Diff(want, card0(t, l)); diff != "" {
			t.Errorf("card 0 once the annotation says it (-want,+got):\n%s", diff)
		}
		// A later shrink written straight into the annotation frees room.
		l.AddPod("notebook", "n", mainOnly, share(0, 2048, 10), false)
		if diff := gocmp.Diff(allocator.Usage{MemoryMiB: 2048 + 8192, Cores: 10 + 40}, card0(t, l)); diff != "" {
			t.Errorf("card 0 after a shrink (-want,+got):\n%s", diff)
		}
	})
	t.Run("a failed resize is forgotten", func(t *testing.T) {
		l := newLedger()
		if err := l.Resize("notebook", share(0, 8192, 50), nil); err != nil {
			t.Fatal(err)
		}
		l.AddPod("notebook", "n", mainOnly, share(0, 4096, 30), false)
		l.ForgetResize("notebook")
		if diff := gocmp.Diff(allocator.Usage{MemoryMiB: 4096 + 8192, Cores: 30 + 40}, card0(t, l)); diff != "" {
			t.Errorf("card 0 after the resize was forgotten (-want,+got):\n%s", diff)
		}
	})
	t.Run("two grows in a row", func(t *testing.T) {
		l := newLedger()
		for _, mem := range []int64{6144, 8192} {
			if err := l.Resize("notebook", share(0, mem, 30), nil); err != nil {
				t.Fatal(err)
			}
		}
		if diff := gocmp.Diff(allocator.Usage{MemoryMiB: 8192 + 8192, Cores: 30 + 40}, card0(t, l)); diff != "" {
			t.Errorf("card 0 (-want,+got):\n%s", diff)
		}
		l.ForgetResize("notebook")
		if diff := gocmp.Diff(allocator.Usage{MemoryMiB: 4096 + 8192, Cores: 30 + 40}, card0(t, l)); diff != "" {
			t.Errorf("card 0 after forgetting: the annotation's share (-want,+got):\n%s", diff)
		}
	})
	for _, tc := range []struct {
		name    string
		resized *gpuinfo.Assignment
		deltas  []allocator.Delta
		wantErr string
	}{
		// 16384 − 8192 (other) leaves 8192 for the notebook.
		{"memory beyond the card", share(0, 8193, 30), nil, "card 0 has 8192 MiB and 60% compute for the pod"},
		{"compute beyond the card", share(0, 4096, 61), nil, "the new share needs 4096 MiB and 61%"},
		{"room a nominated pod will take", share(0, 8192, 30), []allocator.Delta{{UUID: "GPU-n-0", Usage: allocator.Usage{MemoryMiB: 1024, Cores: 10}}}, "card 0 has 7168 MiB and 50% compute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			err := l.Resize("notebook", tc.resized, tc.deltas)
			if !errors.Is(err, ledger.ErrNoRoom) {
				t.Fatalf("got %v, want ErrNoRoom", err)
			}
			testutil.CheckError(t, err, tc.wantErr)
			if diff := gocmp.Diff(allocator.Usage{MemoryMiB: 4096 + 8192, Cores: 30 + 40}, card0(t, l)); diff != "" {
				t.Errorf("card 0 after a refused resize (-want,+got):\n%s", diff)
			}
		})
	}
	t.Run("a pod not bound", func(t *testing.T) {
		l := newLedger()
		if err := l.Resize("nobody", share(0, 1024, 10), nil); err == nil {
			t.Error("a pod the ledger does not hold was resized")
		}
	})
}

// TestResizeRacesPlacements: grows and placements racing for the cards of
// one node never over-commit a card. The reference is the test's own sum of
// the shares it was granted, not the ledger's count.
func TestResizeRacesPlacements(t *testing.T) {
	l := ledger.New()
	const cards, capacity = 2, 16384
	l.SetNode(inventoryNode("n", "1", testutil.MustEncode(testutil.Inventory("n", "T4", capacity, cards))))
	var mu sync.Mutex
	granted := map[types.UID]*gpuinfo.Assignment{}
	grows := 0
	for i := 0; i < 4; i++ {
		uid := types.UID(fmt.Sprintf("resized-%d", i))
		a := share(i%cards, 1024, 5)
		l.AddPod(uid, "n", mainOnly, a, false)
		granted[uid] = a
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 200; i++ {
				if w%2 == 0 {
					uid := types.UID(fmt.Sprintf("resized-%d", r.Intn(4)))
					mu.Lock()
					index := granted[uid].Containers["main"][0].Index
					mu.Unlock()
					grown := share(index, 1024+int64(r.Intn(8192)), 5)
					if l.Resize(uid, grown, nil) == nil {
						mu.Lock()
						granted[uid] = grown
						grows++
						mu.Unlock()
					}
					continue
				}
				uid := types.UID(fmt.Sprintf("placed-%d-%d", w, i))
				req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "main", Count: 1, MemoryMiB: 1 + int64(r.Intn(4096)), Cores: 5}}}
				if a, err := l.Reserve(uid, "n", mainOnly, req, nil, allocator.Strategy{Policy: allocator.Binpack}); err == nil {
					mu.Lock()
					granted[uid] = a
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	if grows == 0 || len(granted) == 4 {
		t.Fatalf("%d grows and %d placements granted: the race was not run", grows, len(granted)-4)
	}
	used := map[string]int64{}
	for _, a := range granted {
		for _, c := range a.Containers["main"] {
			used[c.UUID] += c.MemoryMiB
		}
	}
	for uuid, mem := range used {
		if mem > capacity {
			t.Errorf("card %s: %d MiB granted of %d", uuid, mem, capacity)
		}
	}
}
