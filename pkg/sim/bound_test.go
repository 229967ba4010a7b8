package sim_test

import (
	"math"
	"testing"

	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// TestAllocationBoundByHand checks the bound on an instance solved by hand:
// a T4 node of 2 cards and 8 cores, an A10 node of 4 cards and 64 cores (6
// GPUs). A 2-card T4 task wanting 8 cores per card gets 1 GPU's worth (the
// T4 node's CPU runs out), a 4-card task the A10 node, a half card without
// CPU half of the T4 node's second card: 5.5 of 6 GPUs. A 4-card T4 task
// has no node with four T4s; a CPU-only task changes nothing.
func TestAllocationBoundByHand(t *testing.T) {
	nodes := []trace.Node{
		{Name: "t4", CPUMilli: 8000, GPUs: 2, Model: "T4"},
		{Name: "a10", CPUMilli: 64000, GPUs: 4, Model: "A10"},
		{Name: "cpu", CPUMilli: 64000},
	}
	tasks := []trace.Task{
		{Name: "a", CPUMilli: 16000, NumGPU: 2, GPUMilli: 1000, GPUSpec: []string{"T4"}},
		{Name: "b", CPUMilli: 4000, NumGPU: 4, GPUMilli: 1000},
		{Name: "c", NumGPU: 1, GPUMilli: 500},
		{Name: "d", CPUMilli: 1000, NumGPU: 4, GPUMilli: 1000, GPUSpec: []string{"T4"}},
		{Name: "e", CPUMilli: 32000},
	}
	got, err := sim.AllocationBound(nodes, tasks, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if want := 5.5 / 6 * 100; math.Abs(got-want) > 1e-6 {
		t.Errorf("bound = %.4f%%, want %.4f%%", got, want)
	}
	// Arrived 50% (3 of 6 GPUs) is reached by task a and b together: c
	// and d have not arrived. a gets 1 GPU, b 4.
	got, err = sim.AllocationBound(nodes, tasks, 50)
	if err != nil {
		t.Fatal(err)
	}
	if want := 5.0 / 6 * 100; math.Abs(got-want) > 1e-6 {
		t.Errorf("bound at arrived 50%% = %.4f%%, want %.4f%%", got, want)
	}
}

// TestAllocationBoundHoldsForReplays: no shipped profile's replay allocates
// more than the bound for its arrivals.
func TestAllocationBoundHoldsForReplays(t *testing.T) {
	tCtx := ktesting.Init(t)
	profiles, err := sim.Profiles()
	if err != nil {
		t.Fatal(err)
	}
	nodes := cluster()
	bound, err := sim.AllocationBound(nodes, sim.Arrivals(tasks(), sim.CapacityMilli(sim.GPUNodes(nodes)), 7), 100)
	if err != nil {
		t.Fatal(err)
	}
	if bound <= 0 || bound > 100 {
		t.Fatalf("bound %.2f%% outside (0, 100]", bound)
	}
	for _, profile := range profiles {
		res, err := sim.Run(tCtx, sim.Config{Nodes: nodes, Tasks: tasks(), Seed: 7, Profile: profile})
		if err != nil {
			t.Fatal(err)
		}
		if res.Allocation[100] > bound+1e-6 {
			t.Errorf("%s allocated %.2f%% at arrived 100%%, above the bound %.2f%%", profile, res.Allocation[100], bound)
		}
		t.Logf("%s: %.2f%% allocated, bound %.2f%%", profile, res.Allocation[100], bound)
	}
}

// TestAllocationBoundKeepsSharesWhole: three shares of 60 % on two cards.
// Their total (1.8 GPUs) fits the cards, but no two fit one card: at most
// two are placed, 1.2 of 2 GPUs.
func TestAllocationBoundKeepsSharesWhole(t *testing.T) {
	nodes := []trace.Node{{Name: "n", CPUMilli: 64000, MemoryMiB: 65536, GPUs: 2, Model: "T4"}}
	var tasks []trace.Task
	for _, name := range []string{"a", "b", "c"} {
		tasks = append(tasks, trace.Task{Name: name, CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 600})
	}
	got, err := sim.AllocationBound(nodes, tasks, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := 60.0; math.Abs(got-want) > 1e-6 {
		t.Errorf("bound = %.4f%%, want %.4f%%", got, want)
	}
}
