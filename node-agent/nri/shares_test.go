package nri

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestRunningHoldings: what a running container holds, read back from its
// environment: a share, a whole card, a claim's share; a container's own
// TESSERA_CLAIM (from its pod spec) is overridden by the agent's empty one,
// so it cannot pass its cards off as another claim's.
func TestRunningHoldings(t *testing.T) {
	share := []gpuinfo.CardAssignment{{Index: -1, UUID: "GPU-0", MemoryMiB: 4096, Cores: 30}}
	for _, tc := range []struct {
		name string
		env  []string
		want []enforce.Holding
	}{
		{"a share", []string{"NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=30"},
			[]enforce.Holding{{Key: "container/c1", Cards: share}}},
		{"a whole card", []string{"NVIDIA_VISIBLE_DEVICES=GPU-0"},
			[]enforce.Holding{{Key: "container/c1", Cards: []gpuinfo.CardAssignment{{Index: -1, UUID: "GPU-0", Cores: 100}}}}},
		{"a claim's share", []string{"TESSERA_CLAIM=cuid", "NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=30"},
			[]enforce.Holding{{Key: "claim/cuid", Cards: share}}},
		{"a claim named in the spec, blanked by the agent", []string{"TESSERA_CLAIM=cuid", "NVIDIA_VISIBLE_DEVICES=GPU-0", "CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=30", "TESSERA_CLAIM="},
			[]enforce.Holding{{Key: "container/c1", Cards: share}}},
		{"no card", []string{"NVIDIA_VISIBLE_DEVICES=void"}, nil},
		{"every card, unadjusted", []string{"NVIDIA_VISIBLE_DEVICES=all"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, runningHoldings(&api.Container{Id: "c1", Env: tc.env})); diff != "" {
				t.Errorf("holdings (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestAdmitMIGSlices: shares are counted per MIG slice, not per card: two
// containers on two slices of one card each hold their slice whole; a share
// that would overfill its slice is refused, on the slice's memory; a running
// container is matched to its slice by its MIG device's UUID.
func TestAdmitMIGSlices(t *testing.T) {
	cards := []discovery.Card{{Index: 0, UUID: "GPU-0", MemoryMiB: 40960, MIGEnabled: true, MIG: &gpuinfo.MIG{Slots: 8,
		Profiles: []gpuinfo.MIGProfile{
			{Name: "1g.5gb", Slices: 1, Size: 1, MemoryMiB: 4864, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
			{Name: "3g.20gb", Slices: 3, Size: 4, MemoryMiB: 19968, Starts: []int{0, 4}},
		},
		Instances: []gpuinfo.MIGInstance{{Profile: "3g.20gb", Start: 0, UUID: "MIG-a"}, {Profile: "1g.5gb", Start: 6, UUID: "MIG-b", Index: 1}},
	}}}
	slice := func(id, profile string, start int, memoryMiB, cores int64) []enforce.Holding {
		return []enforce.Holding{{Key: enforce.ContainerKey(id), Cards: []gpuinfo.CardAssignment{
			{Index: 0, UUID: "GPU-0", MemoryMiB: memoryMiB, Cores: cores, MIG: &gpuinfo.MIGSlice{Profile: profile, Start: start}},
		}}}
	}
	var s shares
	if err := s.admit("own", Owner{}, slice("own", "1g.5gb", 6, 4864, 100), cards); err != nil {
		t.Fatalf("a slice of its own: %v", err)
	}
	if err := s.admit("share-1", Owner{}, slice("share-1", "3g.20gb", 0, 12000, 0), cards); err != nil {
		t.Fatalf("a share of the other slice beside it: %v", err)
	}
	err := s.admit("share-2", Owner{}, slice("share-2", "3g.20gb", 0, 9000, 0), cards)
	if err == nil || !strings.Contains(err.Error(), "card 0 (GPU-0/3g.20gb@0) would be over-committed: the containers running on it hold 12000 of its 19968 MiB") {
		t.Errorf("a share overfilling the slice: %v", err)
	}
	// After a restart, the running container is known by what it sees.
	var restarted shares
	restarted.reset(map[string]runningContainer{"own": {holdings: []enforce.Holding{{Key: "container/own", Cards: []gpuinfo.CardAssignment{
		{Index: -1, UUID: "MIG-b", Cores: gpuinfo.FullCores},
	}}}}})
	if err := restarted.admit("again", Owner{}, slice("again", "1g.5gb", 6, 4864, 100), cards); err == nil {
		t.Error("a second container admitted to the slice a running one holds whole")
	}
}

// TestResizedShareIsCounted: once a running container's share is resized,
// admission counts the new share: a grown one leaves no room for a share
// the old one left room for, a shrunk one makes room.
func TestResizedShareIsCounted(t *testing.T) {
	cards := []discovery.Card{{Index: 0, UUID: "GPU-0", MemoryMiB: 16384}}
	share := func(id string, mib int64) []enforce.Holding {
		return []enforce.Holding{{Key: enforce.ContainerKey(id), Cards: []gpuinfo.CardAssignment{{Index: 0, UUID: "GPU-0", MemoryMiB: mib, Cores: 10}}}}
	}
	var s shares
	if err := s.admit("notebook", Owner{}, share("notebook", 8192), cards); err != nil {
		t.Fatal(err)
	}
	if !s.resize(enforce.ContainerKey("notebook"), share("notebook", 12288)[0].Cards) {
		t.Fatal("the running container's holding was not found")
	}
	if err := s.admit("other", Owner{}, share("other", 6144), cards); err == nil {
		t.Error("a share that fits only beside the old share was admitted beside the grown one")
	}
	s.resize(enforce.ContainerKey("notebook"), share("notebook", 4096)[0].Cards)
	if err := s.admit("other", Owner{}, share("other", 12288), cards); err != nil {
		t.Errorf("a share that fits beside the shrunk one was refused: %v", err)
	}
	if s.resize(enforce.ContainerKey("gone"), nil) {
		t.Error("a container that holds nothing was resized")
	}
}
