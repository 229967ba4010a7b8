// Package nvidia is the node agent's discovery backend on real nodes: the
// cards, their health and their XID errors through NVML (go-nvml). It is the
// only package that links NVML, so that tools using the simulated backend
// (the demo, the integration suite) do not.
package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// ErrNoDriver is returned by New on a node without the NVIDIA driver.
var ErrNoDriver = errors.New("NVML library not found: is the NVIDIA driver installed on this node?")

// NVML is the backend of real nodes.
type NVML struct {
	lib      nvml.Interface
	driver   string
	sysfsPCI string
}

// New initializes NVML through lib (nvml.New() in production, a mock in
// tests).
func New(lib nvml.Interface) (*NVML, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, ErrNoDriver
	default:
		return nil, fmt.Errorf("initializing NVML: %s", lib.ErrorString(ret))
	}
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown"
	}
	return &NVML{lib: lib, driver: driver, sysfsPCI: "/sys/bus/pci/devices"}, nil
}

// Name describes the backend.
func (n *NVML) Name() string { return "nvml (driver " + n.driver + ")" }

// Close shuts NVML down.
func (n *NVML) Close() error {
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shutting NVML down: %s", n.lib.ErrorString(ret))
	}
	return nil
}

// Cards lists the cards NVML reports. A card NVML cannot describe is
// reported unhealthy rather than hidden, so the scheduler keeps off it.
func (n *NVML) Cards() ([]discovery.Card, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", n.lib.ErrorString(ret))
	}
	cards := make([]discovery.Card, 0, count)
	for i := 0; i < count; i++ {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %s", i, n.lib.ErrorString(ret))
		}
		c := discovery.Card{Index: i, NUMANode: -1, Healthy: true}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: reading UUID: %s", i, n.lib.ErrorString(ret))
		}
		c.UUID = uuid
		if c.Model, ret = dev.GetName(); ret != nvml.SUCCESS {
			c.Model, c.Healthy = "unknown", false
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			c.MemoryMiB = int64(mem.Total / (1 << 20))
		} else {
			c.Healthy = false
		}
		if c.MemoryMiB < 1 {
			c.MemoryMiB, c.Healthy = 1, false
		}
		if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS {
			c.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		}
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
			c.NUMANode = n.numaNode(busID(pci))
		}
		cards = append(cards, c)
	}
	return cards, nil
}

// busID returns the PCI bus ID in sysfs form, e.g. "0000:07:00.0".
func busID(pci nvml.PciInfo) string {
	var b []byte
	for _, c := range pci.BusIdLegacy {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	id := strings.ToLower(string(b))
	// NVML pads the domain to 8 digits; sysfs uses 4.
	if len(id) == 16 && strings.HasPrefix(id, "0000") {
		id = id[4:]
	}
	return id
}

// numaNode reads the card's NUMA node from sysfs; -1 when unknown.
func (n *NVML) numaNode(busID string) int {
	raw, err := os.ReadFile(filepath.Join(n.sysfsPCI, busID, "numa_node"))
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || v < 0 {
		return -1
	}
	return v
}

// WatchXIDs reports every XID error NVML raises on the node's cards, until
// ctx ends; report classifies them. A card that cannot deliver events is
// skipped (its health still comes from each scan).
func (n *NVML) WatchXIDs(ctx context.Context, report func(uuid string, xid uint64)) error {
	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("creating an NVML event set: %s", n.lib.ErrorString(ret))
	}
	defer set.Free()
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("counting GPUs: %s", n.lib.ErrorString(ret))
	}
	watched := 0
	for i := 0; i < count; i++ {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret == nvml.SUCCESS {
			watched++
		}
	}
	if watched == 0 {
		return fmt.Errorf("no GPU delivers XID events")
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(1000)
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			return fmt.Errorf("waiting for NVML events: %s", n.lib.ErrorString(ret))
		case data.EventType != nvml.EventTypeXidCriticalError || data.Device == nil:
			continue
		}
		uuid, ret := data.Device.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		report(uuid, data.EventData)
	}
	return nil
}
