package nvidia

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// TestStats reads live statistics from go-nvml's mock DGX A100, some of
// whose cards cannot answer everything.
func TestStats(t *testing.T) {
	server := dgxa100.New()
	server.ErrorStringFunc = func(r nvml.Return) string { return fmt.Sprint("NVML error ", int32(r)) }
	const gib = 1 << 30
	type reading struct {
		used              uint64
		util, temp        uint32
		utilErr           nvml.Return
		compute, graphics []nvml.ProcessInfo
		computeErr        nvml.Return
		graphicsErr       nvml.Return
		uuidErr           nvml.Return
	}
	readings := map[int]reading{
		// Process 100 is both a compute and a graphics process.
		0: {used: 10 * gib, util: 87, temp: 64,
			compute:  []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 4 * gib}, {Pid: 200, UsedGpuMemory: 6 * gib}},
			graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 4 * gib}}},
		// No utilisation; a process whose memory NVML does not know.
		1: {used: gib, temp: 40, utilErr: nvml.ERROR_NOT_SUPPORTED,
			compute: []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: notAvailable}}, graphicsErr: nvml.ERROR_NOT_SUPPORTED},
		// No process list at all.
		2: {temp: 35, computeErr: nvml.ERROR_NO_PERMISSION, graphicsErr: nvml.ERROR_NO_PERMISSION},
		// Fell off the bus.
		3: {uuidErr: nvml.ERROR_GPU_IS_LOST},
	}
	for i, d := range server.Devices {
		dev := d.(*dgxa100.Device)
		r := readings[i]
		uuid := dev.GetUUIDFunc
		dev.GetUUIDFunc = func() (string, nvml.Return) {
			if r.uuidErr != nvml.SUCCESS {
				return "", r.uuidErr
			}
			return uuid()
		}
		dev.MemoryInfo.Used = r.used
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: r.util}, r.utilErr }
		dev.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
			if sensor != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return r.temp, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return r.compute, r.computeErr }
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return r.graphics, r.graphicsErr }
	}
	n, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := n.Stats()
	for _, want := range []string{"GPU 1: reading utilization", "GPU 1: reading graphics processes", "GPU 2: reading compute processes", "GPU 3: reading its UUID"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want one containing %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "GPU 0") {
		t.Errorf("error %v names GPU 0, which answered everything", err)
	}
	uuid := func(i int) string {
		u, _ := server.Devices[i].GetUUID()
		return u
	}
	want := []discovery.CardStats{
		{Index: 0, UUID: uuid(0), MemoryUsedMiB: 10240, Utilization: 0.87, TemperatureC: 64, ProcessesKnown: true,
			Processes: []discovery.Process{{PID: 100, MemoryUsedMiB: 4096}, {PID: 200, MemoryUsedMiB: 6144}}},
		{Index: 1, UUID: uuid(1), MemoryUsedMiB: 1024, Utilization: -1, TemperatureC: 40, ProcessesKnown: true,
			Processes: []discovery.Process{{PID: 300}}},
		{Index: 2, UUID: uuid(2), TemperatureC: 35},
	}
	for i := 4; i < 8; i++ {
		want = append(want, discovery.CardStats{Index: i, UUID: uuid(i), ProcessesKnown: true, Processes: []discovery.Process{}})
	}
	if diff := cmp.Diff(want, stats); diff != "" {
		t.Errorf("stats (-want,+got):\n%s", diff)
	}
}

func TestStatsWithoutGPUs(t *testing.T) {
	server := dgxa100.New()
	server.ErrorStringFunc = func(r nvml.Return) string { return fmt.Sprint("NVML error ", int32(r)) }
	n, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	server.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
	if stats, err := n.Stats(); err == nil || stats != nil {
		t.Errorf("Stats() = %v, %v; want an error", stats, err)
	}
}

var _ discovery.StatsReader = (*NVML)(nil)

// TestRealNVMLStats reads the machine's own GPUs' statistics; it skips
// itself where no NVIDIA driver is installed.
func TestRealNVMLStats(t *testing.T) {
	n, err := New(nvml.New())
	if errors.Is(err, ErrNoDriver) {
		t.Skip("no NVIDIA driver on this machine: real NVML statistics not exercised")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	stats, err := n.Stats()
	t.Logf("%+v (errors: %v)", stats, err)
	if len(stats) == 0 {
		t.Fatal("no card's statistics")
	}
	for _, st := range stats {
		if st.MemoryUsedMiB < 0 || st.TemperatureC <= 0 || st.Utilization < 0 || st.Utilization > 1 {
			t.Errorf("card %d: %+v looks wrong", st.Index, st)
		}
	}
}
