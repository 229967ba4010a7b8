package nri

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"

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
