package sim_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// cluster is a small mixed fleet: 2-card T4 nodes, 4-card A10 nodes and
// 8-card V100 nodes.
func cluster() []trace.Node {
	var nodes []trace.Node
	for i := 0; i < 4; i++ {
		nodes = append(nodes,
			trace.Node{Name: fmt.Sprintf("t4-%d", i), CPUMilli: 32000, MemoryMiB: 131072, GPUs: 2, Model: "T4"},
			trace.Node{Name: fmt.Sprintf("a10-%d", i), CPUMilli: 64000, MemoryMiB: 262144, GPUs: 4, Model: "A10"},
			trace.Node{Name: fmt.Sprintf("v100-%d", i), CPUMilli: 96000, MemoryMiB: 393216, GPUs: 8, Model: "V100M32"},
		)
	}
	nodes = append(nodes, trace.Node{Name: "cpu-only", CPUMilli: 96000, MemoryMiB: 393216})
	return nodes
}

// tasks is a deterministic mix of shares, whole cards, multi-card jobs,
// CPU-only tasks and tasks bound to a model.
func tasks() []trace.Task {
	var out []trace.Task
	for i := 0; i < 120; i++ {
		t := trace.Task{Name: fmt.Sprintf("task-%03d", i), CPUMilli: int64(1000 + 500*(i%9)), MemoryMiB: 4096}
		switch i % 6 {
		case 0, 1, 2:
			t.NumGPU, t.GPUMilli = 1, int64(100+(i*70)%900)
		case 3:
			t.NumGPU, t.GPUMilli = 1, 1000
		case 4:
			t.NumGPU, t.GPUMilli = []int{2, 4, 8}[i%3], 1000
		}
		if i%10 == 7 {
			t.GPUSpec = []string{"A10"}
		}
		out = append(out, t)
	}
	return out
}

func TestArrivals(t *testing.T) {
	nodes, ts := sim.GPUNodes(cluster()), tasks()
	capacity := sim.CapacityMilli(nodes)
	if len(nodes) != 12 || capacity != 4*(2+4+8)*1000 {
		t.Fatalf("%d GPU nodes with %d milli-GPU, want 12 with %d", len(nodes), capacity, 4*(2+4+8)*1000)
	}
	a := sim.Arrivals(ts, capacity, 42)
	var total int64
	names := map[string]bool{}
	for _, task := range a {
		total += task.GPUMilliTotal()
		if names[task.Name] {
			t.Fatalf("task %s arrives twice", task.Name)
		}
		names[task.Name] = true
	}
	if float64(total) < sim.Padding*float64(capacity) {
		t.Errorf("arrivals ask %d milli-GPU, want at least %.1f× capacity %d", total, sim.Padding, capacity)
	}
	for _, task := range ts {
		if !names[task.Name] {
			t.Errorf("task %s is missing from the arrivals", task.Name)
		}
	}
	if diff := cmp.Diff(a, sim.Arrivals(ts, capacity, 42)); diff != "" {
		t.Errorf("same seed, different arrivals (-first,+second):\n%s", diff)
	}
	if cmp.Equal(a, sim.Arrivals(ts, capacity, 43)) {
		t.Error("seeds 42 and 43 give the same arrivals")
	}
}

// TestReplay runs every shipped profile through the real scheduler and
// checks the curve: allocation never exceeds what arrived nor capacity,
// never falls (no departures), and a seed replays identically.
func TestReplay(t *testing.T) {
	tCtx := ktesting.Init(t)
	profiles, err := sim.Profiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(profiles) < 3 {
		t.Fatalf("shipped profiles %v, want binpack, spread and fragmentation-aware", profiles)
	}
	for _, profile := range profiles {
		t.Run(profile, func(t *testing.T) {
			cfg := sim.Config{Nodes: cluster(), Tasks: tasks(), Seed: 7, Profile: profile}
			res, err := sim.Run(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.Placed == 0 || res.Placed == res.Tasks {
				t.Fatalf("placed %d of %d tasks with %d scheduler errors; want some placed, some not (the arrivals exceed capacity), no errors", res.Placed, res.Tasks, res.Errors)
			}
			// The task that crosses a percentage may overshoot it by up to
			// its own size, 8 of the 56 cards.
			overshoot := 100 * 8.0 / 56
			for p, v := range res.Allocation {
				if v > float64(p)+overshoot || v > 100 || (p > 0 && v < res.Allocation[p-1]) {
					t.Fatalf("allocation %.2f%% at arrived %d%% (previous %.2f%%)", v, p, res.Allocation[max(p-1, 0)])
				}
			}
			again, err := sim.Run(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(res.Nodes, again.Nodes); diff != "" {
				t.Errorf("same seed placed pods on other nodes (-first,+second):\n%s", diff)
			}
		})
	}
	if _, err := sim.Run(tCtx, sim.Config{Nodes: cluster(), Tasks: tasks(), Profile: "default-scheduler"}); err == nil {
		t.Error("a profile that is not shipped was accepted")
	}
}
