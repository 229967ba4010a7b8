package allocator_test

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestFragmentMemoChangesNothing: a node scored again and again while its
// cards fill and empty, its free CPU moves, a card goes unhealthy and the
// workload changes gets, with a memo, the outcome it gets without one, and
// the memo is used (the same inputs twice in a row).
func TestFragmentMemoChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	workloads := []*allocator.Workload{
		only(pct(50), 4000),
		{Shapes: []allocator.Shape{
			{Weight: 0.5, CPUMilli: 2000, Container: pct(30)},
			{Weight: 0.3, CPUMilli: 8000, Container: gpuinfo.ContainerRequest{Name: "c", Count: 2, Cores: gpuinfo.FullCores}},
			{Weight: 0.2, CPUMilli: 1000, Container: pct(70)},
		}},
	}
	requests := []gpuinfo.PodRequest{
		{Containers: []gpuinfo.ContainerRequest{pct(40)}},
		{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 2, Cores: gpuinfo.FullCores}}},
	}
	// A card that goes unhealthy, its usage unchanged, is measured again:
	// two free cards fit the two-card shape, one does not.
	cards, used := fourCards(allocator.Usage{}, allocator.Usage{}, allocator.Usage{MemoryMiB: 16384, Cores: 100}, allocator.Usage{MemoryMiB: 16384, Cores: 100})
	var memo allocator.FragmentMemo
	pair := &allocator.Workload{Shapes: []allocator.Shape{{Weight: 1, Container: gpuinfo.ContainerRequest{Name: "c", Count: 2, Cores: gpuinfo.FullCores}}}}
	st := allocator.Strategy{Policy: allocator.FragmentationAware, Workload: pair, Memo: &memo}
	allocator.Place(cards, used, nil, &requests[0], st, nil)
	cards[1].Healthy = false
	st.Memo = nil
	want := allocator.Place(cards, used, nil, &requests[0], st, nil)
	st.Memo = &memo
	if diff := cmp.Diff(want, allocator.Place(cards, used, nil, &requests[0], st, nil)); diff != "" {
		t.Fatalf("after a card went unhealthy, outcome with a memo (-without,+with):\n%s", diff)
	}

	cards, used = fourCards()
	for step := range 2000 {
		switch {
		case step%3 == 0:
			// A card's usage changes.
			i := rng.IntN(len(cards))
			p := int64(rng.IntN(5) * 25)
			used[i] = allocator.Usage{MemoryMiB: 16384 * p / 100, Cores: p}
		case step%7 == 0:
			// A card's health changes, and nothing else.
			i := rng.IntN(len(cards))
			cards[i].Healthy = !cards[i].Healthy
		}
		st := allocator.Strategy{
			Policy:       allocator.FragmentationAware,
			Workload:     workloads[rng.IntN(len(workloads))],
			CPUFreeMilli: int64(rng.IntN(4)) * 4000,
			CPUMilli:     1000,
		}
		req := &requests[rng.IntN(len(requests))]
		want := allocator.Place(cards, used, nil, req, st, nil)
		memoized := st
		memoized.Memo = &memo
		for range 2 {
			if diff := cmp.Diff(want, allocator.Place(cards, used, nil, req, memoized, nil)); diff != "" {
				t.Fatalf("step %d: outcome with a memo (-without,+with):\n%s", step, diff)
			}
		}
		if diff := cmp.Diff(allocator.PlaceWithoutGPU(cards, used, st), allocator.PlaceWithoutGPU(cards, used, memoized)); diff != "" {
			t.Fatalf("step %d: outcome without GPUs with a memo (-without,+with):\n%s", step, diff)
		}
	}
}
