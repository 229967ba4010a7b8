package gpucheck_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery/nvidia"
	"github.com/tessera-gpu/tessera/node-agent/gpucheck"
)

// dgx is go-nvml's mock DGX A100 as a lent machine would answer: every
// pair of cards on NVLink, one process on card 0, and an XID 79 on card 2
// once the watch has registered.
func dgx(t *testing.T) *server.Server {
	t.Helper()
	s := dgxa100.New()
	s.ErrorStringFunc = func(r nvml.Return) string { return "NVML error " + string(rune('0'+int(r)%10)) }
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED }
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if i == 0 {
				return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 2 << 30}}, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		}
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 30}, nvml.SUCCESS }
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 50, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	var once sync.Once
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				event := false
				once.Do(func() { event = true })
				if event {
					return nvml.EventData{Device: s.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}, nvml.SUCCESS
				}
				time.Sleep(10 * time.Millisecond) // as NVML blocks until its timeout
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			},
		}, nvml.SUCCESS
	}
	return s
}

func run(t *testing.T, s *server.Server) *gpucheck.Report {
	t.Helper()
	n, err := nvidia.New(s)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	return gpucheck.Run(context.Background(), n, gpucheck.Options{Scans: 3, XIDWait: 100 * time.Millisecond})
}

func verdicts(r *gpucheck.Report) map[string]bool {
	out := map[string]bool{}
	for _, c := range r.Checks {
		out[c.Name] = c.Passed
	}
	return out
}

// TestCheckPassesOnAHealthyCard: on the mock DGX A100 every check passes
// and the report holds what the agent would publish.
func TestCheckPassesOnAHealthyCard(t *testing.T) {
	r := run(t, dgx(t))
	want := map[string]bool{"discovery": true, "inventory": true, "topology": true, "uuids": true, "memory": true, "models": true,
		"numa": true, "health": true, "mig": true, "scan-time": true, "processes": true, "xid-watch": true}
	if diff := cmp.Diff(want, verdicts(r)); diff != "" {
		t.Errorf("verdicts (-want,+got):\n%s\n%s", diff, r.Summary())
	}
	if !r.Passed() || !strings.HasPrefix(r.Summary(), "tessera-gpu-check PASSED: nvml (driver ") {
		t.Errorf("summary:\n%s", r.Summary())
	}
	if r.Inventory == nil || len(r.Inventory.Cards) != 8 || r.Inventory.Links != strings.Repeat("V", 28) {
		t.Errorf("inventory: %+v", r.Inventory)
	}
	if len(r.ScanMillis) != 3 || len(r.Stats) != 8 || len(r.Stats[0].Processes) != 1 || r.Stats[0].Processes[0].MemoryUsedMiB != 2048 {
		t.Errorf("scans %v, stats %+v", r.ScanMillis, r.Stats)
	}
	if len(r.XIDs) != 1 || r.XIDs[0].XID != 79 {
		t.Errorf("XIDs %+v, want the one 79", r.XIDs)
	}
}

// TestCheckFailsAndSaysWhy: a card whose processes NVML will not list,
// a pair of cards it cannot describe and an XID watch that cannot register
// each fail their check, named in the summary; the rest still pass.
func TestCheckFailsAndSaysWhy(t *testing.T) {
	s := dgx(t)
	d1 := s.Devices[1].(*dgxa100.Device)
	d1.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
	d1.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
	d3 := s.Devices[3].(*dgxa100.Device)
	d3.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		return nvml.P2P_STATUS_UNKNOWN, nvml.ERROR_NOT_SUPPORTED
	}
	d3.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	for _, d := range s.Devices {
		d.(*dgxa100.Device).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	}
	r := run(t, s)
	got := verdicts(r)
	for name, want := range map[string]bool{"processes": false, "topology": false, "xid-watch": false, "uuids": true, "memory": true, "inventory": true} {
		if got[name] != want {
			t.Errorf("check %s passed %v, want %v", name, got[name], want)
		}
	}
	summary := r.Summary()
	if r.Passed() || !strings.HasPrefix(summary, "tessera-gpu-check FAILED") {
		t.Errorf("summary:\n%s", summary)
	}
	for _, want := range []string{"FAIL processes", "processes unknown on 1", "FAIL topology", "?", "FAIL xid-watch", "no GPU delivers XID events"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
}
