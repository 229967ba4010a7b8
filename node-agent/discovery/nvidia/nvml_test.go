package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestNVMLWithMockDGXA100(t *testing.T) {
	server := dgxa100.New()
	setTopology(server, nvSwitchTopology)
	n, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// Card 0's NUMA node comes from sysfs, found by its PCI bus ID.
	n.sysfsPCI = t.TempDir()
	dev, _ := server.DeviceGetHandleByIndex(0)
	pci, _ := dev.GetPciInfo()
	dir := filepath.Join(n.sysfsPCI, busID(pci))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	if len(cards) != 8 {
		t.Fatalf("%d cards, want 8", len(cards))
	}
	uuids := map[string]bool{}
	for i, c := range cards {
		if c.Index != i || c.Minor != i || !strings.Contains(c.Model, "NVIDIA A100-SXM4-40GB") || c.MemoryMiB != 40960 || !c.Healthy || c.MIGEnabled {
			t.Errorf("card %d = %+v", i, c)
		}
		uuids[c.UUID] = true
	}
	if len(uuids) != 8 {
		t.Errorf("UUIDs not distinct: %v", uuids)
	}
	if cards[0].NUMANode != 1 {
		t.Errorf("card 0's NUMA node = %d, want 1 (from sysfs)", cards[0].NUMANode)
	}
	if got := n.numaNode("0000:ff:00.0"); got != -1 {
		t.Errorf("NUMA node of a card sysfs does not know = %d, want -1", got)
	}
	if err := discovery.Inventory(cards, gpuinfo.InventoryVersion2).Validate(); err != nil {
		t.Errorf("inventory is invalid: %v", err)
	}
	if !strings.HasPrefix(n.Name(), "nvml (driver 550.54.15") {
		t.Errorf("Name() = %q", n.Name())
	}
}

func TestNVMLWithoutDriver(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		ErrorStringFunc: func(r nvml.Return) string { return "library not found" },
	}
	if _, err := New(lib); !errors.Is(err, ErrNoDriver) {
		t.Errorf("NewNVML = %v, want ErrNoDriver", err)
	}
}

// TestRealNVML discovers the machine's own GPUs; it skips itself where no
// NVIDIA driver is installed.
func TestRealNVML(t *testing.T) {
	n, err := New(nvml.New())
	if errors.Is(err, ErrNoDriver) {
		t.Skip("no NVIDIA driver on this machine: real NVML discovery not exercised")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %+v", n.Name(), cards)
	if len(cards) == 0 {
		t.Fatal("NVML initialized but reported no GPUs")
	}
	inv := discovery.Inventory(cards, gpuinfo.InventoryVersion2)
	if err := inv.Validate(); err != nil {
		t.Fatalf("inventory is invalid: %v", err)
	}
	for _, c := range inv.Cards {
		if c.MemoryMiB < 1024 || c.Cores != gpuinfo.FullCores {
			t.Errorf("card %+v looks wrong", c)
		}
	}
}

func TestWatchXIDs(t *testing.T) {
	devices := []*mock.Device{}
	for i := 0; i < 2; i++ {
		uuid := fmt.Sprint("GPU-", i)
		devices = append(devices, &mock.Device{
			GetUUIDFunc:        func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			RegisterEventsFunc: func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS },
		})
	}
	events := []nvml.EventData{
		{Device: devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 79},
		{Device: devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 13},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	set := &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			if len(events) == 0 {
				cancel() // the watch returns once ctx ends
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			e := events[0]
			events = events[1:]
			return e, nvml.SUCCESS
		},
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "test", nvml.SUCCESS },
		ErrorStringFunc:            func(nvml.Return) string { return "error" },
		EventSetCreateFunc:         func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devices[i], nvml.SUCCESS },
	}
	n, err := New(lib)
	if err != nil {
		t.Fatal(err)
	}
	type xid struct {
		uuid string
		xid  uint64
	}
	var got []xid
	if err := n.WatchXIDs(ctx, func(uuid string, x uint64) { got = append(got, xid{uuid, x}) }); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]xid{{"GPU-0", 79}, {"GPU-1", 13}}, got, cmp.AllowUnexported(xid{})); diff != "" {
		t.Errorf("reported XIDs (-want,+got):\n%s", diff)
	}
}

// TestCardOffTheBus: a card NVML stops answering for is reported unhealthy
// under its last good reading; the other cards are kept as they are.
func TestCardOffTheBus(t *testing.T) {
	server := dgxa100.New()
	setTopology(server, nvSwitchTopology)
	lost := loseCards(server)
	n, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	before, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	lost[3] = true
	after, err := n.Cards()
	if err != nil {
		t.Fatalf("one lost card failed the scan: %v", err)
	}
	want := slices.Clone(before)
	want[3].Healthy = false
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("cards after card 3 fell off the bus (-want,+got):\n%s", diff)
	}

	// A card never read is left out, not invented.
	fresh, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	cards, err := fresh.Cards()
	if err != nil || len(cards) != 7 || slices.ContainsFunc(cards, func(c discovery.Card) bool { return c.Index == 3 }) {
		t.Errorf("a fresh scan with card 3 lost: %d cards, %v", len(cards), err)
	}
}

// TestNVMLInitialisedAgain: when NVML stops answering (a driver reload), the
// backend shuts it down and initialises it again instead of failing every
// scan until the agent restarts.
func TestNVMLInitialisedAgain(t *testing.T) {
	server := dgxa100.New()
	setTopology(server, nvSwitchTopology)
	count, initialise := server.DeviceGetCountFunc, server.InitFunc
	inits, reloaded := 0, false
	server.InitFunc = func() nvml.Return {
		inits++
		if inits > 1 {
			reloaded = true
		}
		return initialise()
	}
	server.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	server.DeviceGetCountFunc = func() (int, nvml.Return) {
		if !reloaded {
			return 0, nvml.ERROR_UNINITIALIZED
		}
		return count()
	}
	n, err := New(server)
	if err != nil {
		t.Fatal(err)
	}
	cards, err := n.Cards()
	if err != nil || len(cards) != 8 || inits != 2 {
		t.Errorf("after NVML stopped answering: %d cards, %v, %d initialisations; want 8 cards after a second one", len(cards), err, inits)
	}
}

// loseCards makes the cards whose indices the test sets in the returned map
// fall off the bus: NVML gives no handle for them.
func loseCards(s *server.Server) map[int]bool {
	handle := s.DeviceGetHandleByIndexFunc
	lost := map[int]bool{}
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if lost[i] {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return handle(i)
	}
	return lost
}
