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
	"slices"
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
	// known is the last good reading of each card, by index: a card that
	// stops answering is reported under it, unhealthy.
	known map[int]discovery.Card
	// migProblems is, by index, why a card in MIG mode has its geometry
	// left out, as last logged.
	migProblems map[int]string
	// topology is the last complete measurement of the links between the
	// cards, measured again when they change.
	topology topology
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
	return &NVML{lib: lib, driver: driver, sysfsPCI: "/sys/bus/pci/devices", known: map[int]discovery.Card{}, migProblems: map[int]string{}}, nil
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

// Cards lists the cards NVML reports. A card NVML can no longer describe (it
// fell off the bus, its handle or UUID cannot be read) is reported unhealthy,
// its MIG instances too, under its last good reading, the others as they
// are; one never read is left out. The links between the cards are measured
// when the cards change; a card reported under its last reading keeps its
// last links. When NVML itself stops answering (a driver reload), it is shut
// down and initialised again before giving up.
func (n *NVML) Cards() ([]discovery.Card, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		if err := n.reinit(); err != nil {
			return nil, fmt.Errorf("counting GPUs: %s; %w", n.lib.ErrorString(ret), err)
		}
		if count, ret = n.lib.DeviceGetCount(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("counting GPUs after initialising NVML again: %s", n.lib.ErrorString(ret))
		}
	}
	cards := make([]discovery.Card, 0, count)
	answered := make([]bool, count)
	for i := 0; i < count; i++ {
		c, ok := n.card(i)
		answered[i] = ok
		if !ok {
			last, known := n.known[i]
			if !known {
				continue
			}
			last.Healthy = false
			last.MIG = withUnhealthyInstances(last.MIG)
			c = last
		}
		cards = append(cards, c)
	}
	links := n.links(cards, answered)
	for p := range cards {
		if c := &cards[p]; answered[c.Index] {
			c.Links = slices.Clone(links[c.Index])
			n.known[c.Index] = *c
		}
	}
	return cards, nil
}

// card reads card i, with its NUMA node and PCIe root from sysfs and its MIG
// geometry when it is in MIG mode, but not its links (Cards measures them);
// false when NVML cannot give its handle or UUID.
func (n *NVML) card(i int) (discovery.Card, bool) {
	dev, ret := n.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return discovery.Card{}, false
	}
	c := discovery.Card{Index: i, Minor: -1, NUMANode: -1, Healthy: true}
	if c.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS || c.UUID == "" {
		return discovery.Card{}, false
	}
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
	if minor, ret := dev.GetMinorNumber(); ret == nvml.SUCCESS {
		c.Minor = minor
	}
	if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS {
		c.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	}
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		id := busID(pci)
		c.NUMANode, c.PCIeRoot = n.numaNode(id), n.pcieRoot(id)
	}
	if c.MIGEnabled {
		c.MIG = n.migGeometry(c, dev)
	}
	return c, true
}

// reinit shuts NVML down and initialises it again, as after a driver reload.
func (n *NVML) reinit() error {
	_ = n.lib.Shutdown()
	if ret := n.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initialising NVML again: %s", n.lib.ErrorString(ret))
	}
	if driver, ret := n.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		n.driver = driver
	}
	return nil
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

// WatchXIDs reports every XID error NVML raises on the cards present when it
// starts, until ctx ends or NVML fails; report classifies them. A card that
// cannot deliver events is skipped (its health still comes from each scan).
// The agent starts it again when the cards change or it has stopped.
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
