package linksim

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/topology"
)

func small(seed uint64, fleet []NodeGroup) Config {
	return Config{Seed: seed, Fleet: fleet, Mix: DefaultMix, Pods: 400, Load: 0.9}
}

// TestRunIsReproducible: a seed gives the same result every time.
func TestRunIsReproducible(t *testing.T) {
	for _, p := range Policies {
		first, err := Run(small(7, DefaultFleet), p)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Run(small(7, DefaultFleet), p)
		if diff := cmp.Diff(first, again); diff != "" {
			t.Errorf("%s: second run differs (-first,+second):\n%s", p.Name, diff)
		}
		other, _ := Run(small(8, DefaultFleet), p)
		if cmp.Equal(first, other) {
			t.Errorf("%s: seeds 7 and 8 give the same result", p.Name)
		}
	}
}

// TestRunCounts checks the accounting against what the fleet allows: on
// NVSwitch nodes alone every multi-card pod is on NVLink, on PCIe nodes
// none is, and allocation stays within the fleet.
func TestRunCounts(t *testing.T) {
	for _, tc := range []struct {
		shape  string
		cards  int
		nvlink bool
	}{
		{topology.NVSwitch, 8, true},
		{topology.PCIeSockets, 8, false},
	} {
		for _, p := range Policies {
			r, err := Run(small(3, []NodeGroup{{Shape: tc.shape, Cards: tc.cards, Count: 6}}), p)
			if err != nil {
				t.Fatal(err)
			}
			for size, n := range r.Placed {
				if size == 1 {
					continue
				}
				want := 0
				if tc.nvlink {
					want = n
				}
				if r.OnNVLink[size] != want || r.AtBest[size] > n {
					t.Errorf("%s on %s: %d-card pods: %d placed, %d on NVLink (want %d), %d at best", p.Name, tc.shape, size, n, r.OnNVLink[size], want, r.AtBest[size])
				}
			}
			if r.Allocation <= 0 || r.Allocation > 1 {
				t.Errorf("%s on %s: allocation %v outside (0, 1]", p.Name, tc.shape, r.Allocation)
			}
		}
	}
}

// TestRunRejectsUnknownShapes names the node group.
func TestRunRejectsUnknownShapes(t *testing.T) {
	if _, err := Run(small(1, []NodeGroup{{Shape: "torus", Cards: 8, Count: 1}}), Policies[0]); err == nil {
		t.Error("an unknown shape was accepted")
	}
}
