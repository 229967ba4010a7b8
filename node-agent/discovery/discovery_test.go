package discovery

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestSimulated(t *testing.T) {
	tests := []struct {
		spec    string
		want    []Card
		wantErr string
	}{
		{spec: "2xT4-16GB", want: []Card{
			{Index: 0, UUID: "GPU-sim-n-0", Model: "Tesla T4", MemoryMiB: 15360, NUMANode: -1, Healthy: true},
			{Index: 1, Minor: 1, UUID: "GPU-sim-n-1", Model: "Tesla T4", MemoryMiB: 15360, NUMANode: -1, Healthy: true},
		}},
		{spec: "1xA100-80GB, 1xRTX6000-48GB", want: []Card{
			{Index: 0, UUID: "GPU-sim-n-0", Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, NUMANode: -1, Healthy: true},
			{Index: 1, Minor: 1, UUID: "GPU-sim-n-1", Model: "RTX6000", MemoryMiB: 49152, NUMANode: -1, Healthy: true},
		}},
		{spec: "8", wantErr: "want COUNTxMODEL-MEMORYGB"},
		{spec: "0xT4-16GB", wantErr: "want COUNTxMODEL-MEMORYGB"},
		{spec: "2xT4", wantErr: `model "T4": want NAME-<N>GB`},
		{spec: "2xT4-lotsGB", wantErr: "memory must be a whole number"},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			s, err := NewSimulated("n", tc.spec)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			got, _ := s.Cards()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cards (-want,+got):\n%s", diff)
			}
			if err := Inventory(got, gpuinfo.InventoryVersion2).Validate(); err != nil {
				t.Errorf("inventory of simulated cards is invalid: %v", err)
			}
		})
	}
}

func TestSimulatedStats(t *testing.T) {
	s, err := NewSimulated("n", "2xT4-16GB")
	if err != nil {
		t.Fatal(err)
	}
	usage := map[string]int64{"ctr-b": 2048, "ctr-a": 1024}
	s.SetUsage(1, SimulatedUsage{Utilization: 0.5, TemperatureC: 70, Containers: usage, OtherMiB: 10})
	usage["ctr-a"] = 1 // SetUsage keeps its own copy
	got, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := []CardStats{
		{Index: 0, UUID: "GPU-sim-n-0", TemperatureC: 30, ProcessesKnown: true, Processes: []Process{}},
		{Index: 1, UUID: "GPU-sim-n-1", MemoryUsedMiB: 3082, Utilization: 0.5, TemperatureC: 70, ProcessesKnown: true, Processes: []Process{
			{ContainerID: "ctr-a", MemoryUsedMiB: 1024}, {ContainerID: "ctr-b", MemoryUsedMiB: 2048}, {MemoryUsedMiB: 10},
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats (-want,+got):\n%s", diff)
	}
}
