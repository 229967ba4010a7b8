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
