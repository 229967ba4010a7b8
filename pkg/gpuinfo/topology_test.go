package gpuinfo_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

func TestLinkPositionCountsPairsInOrder(t *testing.T) {
	for n := 2; n <= gpuinfo.MaxCardsPerNode; n++ {
		next := 0
		for i := 0; i < n; i++ {
			for j := i + 1; j < n; j++ {
				if got := gpuinfo.LinkPosition(i, j, n); got != next {
					t.Fatalf("n=%d: position of (%d,%d) = %d, want %d", n, i, j, got, next)
				}
				if got := gpuinfo.LinkPosition(j, i, n); got != next {
					t.Fatalf("n=%d: position of (%d,%d) = %d, want %d", n, j, i, got, next)
				}
				next++
			}
		}
		if next != gpuinfo.LinkPairs(n) {
			t.Fatalf("n=%d: %d pairs, LinkPairs says %d", n, next, gpuinfo.LinkPairs(n))
		}
	}
}

func TestInventoryLinkReadsEncodedLinks(t *testing.T) {
	inv := &gpuinfo.Inventory{Cards: make([]gpuinfo.Card, 5)}
	link := func(i, j int) gpuinfo.LinkClass { return gpuinfo.LinkClass((i*3 + j) % int(gpuinfo.NumLinkClasses)) }
	inv.Links = gpuinfo.EncodeLinks(5, link)
	for i := 0; i < 5; i++ {
		for j := i + 1; j < 5; j++ {
			if got := inv.Link(j, i); got != link(i, j) {
				t.Errorf("link(%d,%d) = %v, want %v", j, i, got, link(i, j))
			}
		}
	}
}

func TestNVLinkDomains(t *testing.T) {
	chain := func(i, j int) gpuinfo.LinkClass {
		if j == i+1 && i != 2 {
			return gpuinfo.LinkNVLink
		}
		return gpuinfo.LinkSystem
	}
	tests := []struct {
		name string
		n    int
		link func(i, j int) gpuinfo.LinkClass
		want []int
	}{
		{"nvswitch", 8, func(i, j int) gpuinfo.LinkClass { return topology.Link(topology.NVSwitch, 8, i, j) }, []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"quads", 8, func(i, j int) gpuinfo.LinkClass { return topology.Link(topology.NVLinkQuads, 8, i, j) }, []int{1, 1, 1, 1, 2, 2, 2, 2}},
		{"pcie", 4, func(i, j int) gpuinfo.LinkClass { return topology.Link(topology.PCIeSockets, 4, i, j) }, []int{0, 0, 0, 0}},
		{"chains, joined through other cards", 6, chain, []int{1, 1, 1, 2, 2, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, gpuinfo.NVLinkDomains(tc.n, tc.link)); diff != "" {
				t.Errorf("domains (-want,+got):\n%s", diff)
			}
		})
	}
}
