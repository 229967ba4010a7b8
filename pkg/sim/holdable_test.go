package sim

import (
	"testing"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// TestHoldable: a departure requeues only the pods its node could ever hold.
func TestHoldable(t *testing.T) {
	nodes := []trace.Node{
		{Name: "t4", CPUMilli: 16000, GPUs: 2, Model: "T4"},
		{Name: "v100", CPUMilli: 96000, GPUs: 8, Model: "V100M32"},
	}
	can := holdable(nodes, gpuinfo.DefaultResourceNames())
	tests := []struct {
		name string
		task trace.Task
		on   map[string]bool
	}{
		{"a share anywhere", trace.Task{CPUMilli: 4000, NumGPU: 1, GPUMilli: 300}, map[string]bool{"t4": true, "v100": true}},
		{"more CPU than the T4 node has", trace.Task{CPUMilli: 24000, NumGPU: 1, GPUMilli: 300}, map[string]bool{"t4": false, "v100": true}},
		{"four cards", trace.Task{CPUMilli: 1000, NumGPU: 4, GPUMilli: 1000}, map[string]bool{"t4": false, "v100": true}},
		{"T4 only", trace.Task{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000, GPUSpec: []string{"T4"}}, map[string]bool{"t4": true, "v100": false}},
		{"CPU only", trace.Task{CPUMilli: 32000}, map[string]bool{"t4": false, "v100": true}},
		{"a node the replay does not know", trace.Task{CPUMilli: 1000, NumGPU: 1, GPUMilli: 1000}, map[string]bool{"other": true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.task.Name = "p"
			p := pod(tc.task, 0, "tessera-binpack")
			for node, want := range tc.on {
				if got := can(p, node); got != want {
					t.Errorf("on %s: %v, want %v", node, got, want)
				}
			}
		})
	}
}

// TestPendingForFullModel: a waiting pod counts as waiting for a full
// model when the nodes that could hold it (its models, enough cards) have
// less free GPU than it asks, together; one that waits while enough is free
// there, on one node or split over several, does not.
func TestPendingForFullModel(t *testing.T) {
	nodes := []trace.Node{
		{Name: "t4-a", CPUMilli: 16000, GPUs: 2, Model: "T4"},
		{Name: "t4-b", CPUMilli: 16000, GPUs: 2, Model: "T4"},
		{Name: "v100", CPUMilli: 96000, GPUs: 8, Model: "V100M32"},
	}
	running := []struct {
		task trace.Task
		node string
	}{
		{trace.Task{NumGPU: 2, GPUMilli: 1000, GPUSpec: []string{"T4"}}, "t4-a"},
		{trace.Task{NumGPU: 1, GPUMilli: 1000}, "t4-b"},
		{trace.Task{NumGPU: 6, GPUMilli: 1000}, "v100"},
	}
	waiting := map[string]struct {
		task        trace.Task
		forCapacity bool
	}{
		"two T4 cards, one free":          {trace.Task{NumGPU: 2, GPUMilli: 1000, GPUSpec: []string{"T4"}}, true},
		"one T4 card, one free":           {trace.Task{NumGPU: 1, GPUMilli: 1000, GPUSpec: []string{"T4"}}, false},
		"two cards, free on two models":   {trace.Task{NumGPU: 2, GPUMilli: 1000}, false},
		"three cards, only V100 has them": {trace.Task{NumGPU: 3, GPUMilli: 1000}, true},
		"eight cards, only V100 has them": {trace.Task{NumGPU: 8, GPUMilli: 1000}, true},
	}
	r := &departuresReplay{pending: map[string]*live{}, running: map[string]*live{}}
	for i, run := range running {
		run.task.Name = "running-" + string(rune('a'+i))
		p := pod(run.task, i, "tessera-binpack")
		p.Spec.NodeName = run.node
		r.running[p.Name] = &live{task: run.task, pod: p}
	}
	want := 0
	for name, w := range waiting {
		w.task.Name = name
		r.pending[name] = &live{task: w.task, pod: pod(w.task, 0, "tessera-binpack")}
		if w.forCapacity {
			want++
		}
	}
	if got := r.pendingForFullModel(nodes, holdable(nodes, gpuinfo.DefaultResourceNames())); got != want {
		t.Errorf("%d pods waiting for a full model, want %d", got, want)
	}
}
