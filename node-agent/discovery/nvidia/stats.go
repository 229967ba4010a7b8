package nvidia

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// notAvailable is the used memory NVML gives a process whose usage it does
// not know.
const notAvailable = ^uint64(0)

// Stats reads each card's used memory, utilisation, temperature and the
// processes using it (compute and graphics, their memory by host PID). What
// NVML cannot read is left unknown and its error returned, joined with the
// others; a card whose handle or UUID cannot be read is left out.
func (n *NVML) Stats() ([]discovery.CardStats, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", n.lib.ErrorString(ret))
	}
	var errs []error
	fail := func(i int, what string, ret nvml.Return) {
		errs = append(errs, fmt.Errorf("GPU %d: reading %s: %s", i, what, n.lib.ErrorString(ret)))
	}
	stats := make([]discovery.CardStats, 0, count)
	for i := 0; i < count; i++ {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			fail(i, "its handle", ret)
			continue
		}
		st := discovery.CardStats{Index: i, MemoryUsedMiB: -1, Utilization: -1, TemperatureC: -1}
		if st.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
			fail(i, "its UUID", ret)
			continue
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			st.MemoryUsedMiB = int64(mem.Used / (1 << 20))
		} else {
			fail(i, "memory", ret)
		}
		if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
			st.Utilization = float64(u.Gpu) / 100
		} else {
			fail(i, "utilization", ret)
		}
		if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			st.TemperatureC = float64(t)
		} else {
			fail(i, "temperature", ret)
		}
		st.Processes, st.ProcessesKnown = n.processes(i, dev, fail)
		stats = append(stats, st)
	}
	return stats, errors.Join(errs...)
}

// processes lists the card's compute and graphics processes, once each (a
// process can be both); false when neither list could be read.
func (n *NVML) processes(i int, dev nvml.Device, fail func(int, string, nvml.Return)) ([]discovery.Process, bool) {
	var procs []discovery.Process
	at := map[uint32]int{}
	known := false
	for _, list := range []struct {
		name string
		read func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"compute processes", dev.GetComputeRunningProcesses},
		{"graphics processes", dev.GetGraphicsRunningProcesses},
	} {
		infos, ret := list.read()
		if ret != nvml.SUCCESS {
			fail(i, list.name, ret)
			continue
		}
		known = true
		for _, p := range infos {
			var mib int64
			if p.UsedGpuMemory != notAvailable {
				mib = int64(p.UsedGpuMemory / (1 << 20))
			}
			if j, seen := at[p.Pid]; seen {
				procs[j].MemoryUsedMiB = max(procs[j].MemoryUsedMiB, mib)
				continue
			}
			at[p.Pid] = len(procs)
			procs = append(procs, discovery.Process{PID: p.Pid, MemoryUsedMiB: mib})
		}
	}
	if !known {
		return nil, false
	}
	if procs == nil {
		procs = []discovery.Process{}
	}
	return procs, true
}
