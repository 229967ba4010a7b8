package sim_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// TestOfflinePackByHand: the CPU-poor node must take the whole-card tasks
// that need little CPU, so that the CPU-heavy shares find the CPU-rich
// node's CPU. Placing by room on the card alone (the nodes tie, the first
// wins) puts both whole cards on the CPU-rich node and leaves the shares
// out: 2 of 4 GPUs instead of 3.
func TestOfflinePackByHand(t *testing.T) {
	nodes := []trace.Node{
		{Name: "cpu-rich", CPUMilli: 64000, MemoryMiB: 65536, GPUs: 2, Model: "T4"},
		{Name: "cpu-poor", CPUMilli: 8000, MemoryMiB: 65536, GPUs: 2, Model: "T4"},
	}
	tasks := []trace.Task{
		{Name: "whole-a", CPUMilli: 4000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000},
		{Name: "whole-b", CPUMilli: 4000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000},
		{Name: "share-c", CPUMilli: 30000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500},
		{Name: "share-d", CPUMilli: 30000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500},
		{Name: "cpu-only", CPUMilli: 2000, MemoryMiB: 1024},
	}
	got, err := sim.OfflinePack(nodes, tasks, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := 75.0; math.Abs(got.Allocation-want) > 1e-9 {
		t.Errorf("allocation = %.2f%%, want %.2f%%", got.Allocation, want)
	}
	if got.Placed != 4 || got.GPUTasks != 4 || got.CPUPlaced != 1 || got.Tasks != 5 {
		t.Errorf("placed %d of %d GPU tasks and %d CPU-only of %d tasks, want 4 of 4, 1 of 5", got.Placed, got.GPUTasks, got.CPUPlaced, got.Tasks)
	}
	if got.Balance == 0 {
		t.Errorf("the best start weighs no CPU balance; it cannot place the shares")
	}
}

// TestOfflinePackWithinBound: on random fleets and task lists (models,
// model constraints, whole cards and shares, CPU and memory that bind), the
// offline packer never places more GPU than the relaxation's bound allows,
// and never more than arrived.
func TestOfflinePackWithinBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	models := []string{"T4", "A10", "G2"}
	for round := range 200 {
		var nodes []trace.Node
		for i := range 1 + rng.IntN(6) {
			nodes = append(nodes, trace.Node{
				Name: fmt.Sprintf("n%d", i), CPUMilli: int64(4000 + 4000*rng.IntN(8)), MemoryMiB: int64(16384 * (1 + rng.IntN(8))),
				GPUs: []int{1, 2, 4, 8}[rng.IntN(4)], Model: models[rng.IntN(len(models))],
			})
		}
		var tasks []trace.Task
		for i := range 1 + rng.IntN(30) {
			task := trace.Task{Name: fmt.Sprintf("t%d", i), CPUMilli: int64(500 * rng.IntN(16)), MemoryMiB: int64(1024 * rng.IntN(32))}
			switch rng.IntN(4) {
			case 0:
			case 1:
				task.NumGPU, task.GPUMilli = 1+rng.IntN(4), 1000
			default:
				task.NumGPU, task.GPUMilli = 1, int64(50+rng.IntN(19)*50)
			}
			if rng.IntN(3) == 0 {
				task.GPUSpec = []string{models[rng.IntN(len(models))]}
			}
			tasks = append(tasks, task)
		}
		packed, err := sim.OfflinePack(nodes, tasks, 100)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		bound, err := sim.AllocationBound(nodes, tasks, 100)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var arrivedMilli int64
		for _, task := range tasks {
			arrivedMilli += task.GPUMilliTotal()
		}
		arrivedPercent := float64(arrivedMilli) * 100 / float64(sim.CapacityMilli(nodes))
		if packed.Allocation > bound+1e-6 || packed.Allocation > arrivedPercent+1e-6 {
			t.Errorf("round %d: packed %.3f%%, above the bound %.3f%% or the arrived %.3f%%\nnodes %+v\ntasks %+v", round, packed.Allocation, bound, arrivedPercent, nodes, tasks)
		}
	}
}
