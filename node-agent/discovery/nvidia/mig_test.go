package nvidia

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// maxMIGDevices is how many MIG devices the extended mock cards count, as
// NVML does on an A100 or H100.
const maxMIGDevices = 7

// extendMIG completes the MIG support of go-nvml's mock card d, whose
// create calls check neither placement nor overlap and which has no MIG
// devices: creating a GPU instance at a placement its profile's table does
// not list, or over another instance's slots, is refused
// (ERROR_INSUFFICIENT_RESOURCES); destroying a GPU instance that holds
// compute instances is refused (ERROR_IN_USE), as NVML does; and each compute
// instance is a MIG device the card lists by index, with a UUID, until its
// compute or GPU instance is destroyed.
func extendMIG(d *server.Device) {
	create := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if !slices.Contains(d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)], *at) || takenBy(d, *at) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		gi, ret := create(info, at)
		if ret == nvml.SUCCESS {
			refuseDestroyInUse(gi.(*server.GpuInstance))
		}
		return gi, ret
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return maxMIGDevices, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		devices := mockMIGDevices(d)
		switch {
		case i < 0 || i >= maxMIGDevices:
			return nil, nvml.ERROR_INVALID_ARGUMENT
		case i >= len(devices):
			return nil, nvml.ERROR_NOT_FOUND
		}
		return devices[i], nvml.SUCCESS
	}
}

// refuseDestroyInUse makes mock GPU instance gi refuse to be destroyed
// while it holds compute instances.
func refuseDestroyInUse(gi *server.GpuInstance) {
	destroy := gi.DestroyFunc
	gi.DestroyFunc = func() nvml.Return {
		gi.RLock()
		inUse := len(gi.ComputeInstances) > 0
		gi.RUnlock()
		if inUse {
			return nvml.ERROR_IN_USE
		}
		return destroy()
	}
}

// takenBy reports whether a GPU instance of d takes one of at's slots.
func takenBy(d *server.Device, at nvml.GpuInstancePlacement) bool {
	d.RLock()
	defer d.RUnlock()
	for gi := range d.GpuInstances {
		if overlap(gi.Info.Placement, at) {
			return true
		}
	}
	return false
}

// overlap reports whether placements a and b share a slot.
func overlap(a, b nvml.GpuInstancePlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

// mockMIGDevices are the MIG devices of mock card d, one per compute
// instance, by GPU instance ID and then compute instance ID.
func mockMIGDevices(d *server.Device) []nvml.Device {
	d.RLock()
	gis := slices.SortedFunc(maps.Keys(d.GpuInstances), func(a, b *server.GpuInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
	d.RUnlock()
	var devices []nvml.Device
	for _, gi := range gis {
		gi.RLock()
		cis := slices.SortedFunc(maps.Keys(gi.ComputeInstances), func(a, b *server.ComputeInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
		gi.RUnlock()
		for _, ci := range cis {
			devices = append(devices, mockMIGDevice(d, gi.Info, ci.Info))
		}
	}
	return devices
}

// mockMIGDevice is the MIG device of compute instance ci of GPU instance gi
// of mock card d.
func mockMIGDevice(d *server.Device, gi nvml.GpuInstanceInfo, ci nvml.ComputeInstanceInfo) *mock.Device {
	memory := uint64(d.Config.MIGProfiles.GpuInstanceProfiles[int(gi.ProfileId)].MemorySizeMB) << 20
	return &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return migUUID(d, gi.Id, ci.Id), nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(gi.Id), nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(ci.Id), nvml.SUCCESS },
		GetMemoryInfoFunc:        func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: memory, Free: memory}, nvml.SUCCESS },
	}
}

// migUUID is the UUID of the MIG device of compute instance ci of GPU
// instance gi of mock card d.
func migUUID(d *server.Device, gi, ci uint32) string {
	return fmt.Sprintf("MIG-%s-%d-%d", strings.TrimPrefix(d.UUID, "GPU-"), gi, ci)
}

// mockMIGIndex is the index under mock card d of its MIG device uuid.
func mockMIGIndex(t *testing.T, d *server.Device, uuid string) int {
	t.Helper()
	for i := range maxMIGDevices {
		if mig, ret := d.GetMigDeviceHandleByIndex(i); ret == nvml.SUCCESS {
			if got, _ := mig.GetUUID(); got == uuid {
				return i
			}
		}
	}
	t.Fatalf("mock card has no MIG device %s", uuid)
	return -1
}

// mockSlice is the instance discovery should report for the mock's MIG
// device uuid, of profile at start: its index, GPU and compute instance IDs
// as the mock's handles give them.
func mockSlice(t *testing.T, d *server.Device, profile string, start int, uuid string) gpuinfo.MIGInstance {
	t.Helper()
	index := mockMIGIndex(t, d, uuid)
	mig, _ := d.GetMigDeviceHandleByIndex(index)
	gi, ret := mig.GetGpuInstanceId()
	ci, ret2 := mig.GetComputeInstanceId()
	if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS {
		t.Fatalf("mock MIG device %s: no instance IDs (%v, %v)", uuid, ret, ret2)
	}
	return gpuinfo.MIGInstance{Profile: profile, Start: start, UUID: uuid, Index: index, GPUInstance: gi, ComputeInstance: ci, Healthy: true}
}

// mockCard returns card i of s, extended and in MIG mode.
func mockCard(t *testing.T, s *server.Server, i int) *server.Device {
	t.Helper()
	d := s.Devices[i].(*server.Device)
	extendMIG(d)
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("enabling MIG mode on card %d: %v", i, ret)
	}
	return d
}

// createGPUInstance creates on d a GPU instance of profile id at the
// placement of its table that starts at start.
func createGPUInstance(t *testing.T, d *server.Device, id, start int) nvml.GpuInstance {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(id)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU instance profile %d: %v", id, ret)
	}
	i := slices.IndexFunc(d.Config.MIGProfiles.GpuInstancePlacements[id], func(p nvml.GpuInstancePlacement) bool { return int(p.Start) == start })
	if i < 0 {
		t.Fatalf("GPU instance profile %d cannot start at %d", id, start)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &d.Config.MIGProfiles.GpuInstancePlacements[id][i])
	if ret != nvml.SUCCESS {
		t.Fatalf("creating a GPU instance of profile %d at %d: %v", id, start, ret)
	}
	return gi
}

// createMIGDevice creates on d a GPU instance of profile id at start and a
// compute instance spanning it, and returns the UUID of its MIG device.
func createMIGDevice(t *testing.T, d *server.Device, id, start int) string {
	t.Helper()
	gi := createGPUInstance(t, d, id, start)
	giInfo, _ := gi.GetInfo()
	slicesOfGI := d.Config.MIGProfiles.GpuInstanceProfiles[id].SliceCount
	for ciProfile := 0; ciProfile < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ciProfile++ {
		info, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS || info.SliceCount != slicesOfGI {
			continue
		}
		ci, ret := gi.CreateComputeInstance(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("creating a compute instance in GPU instance %d: %v", giInfo.Id, ret)
		}
		ciInfo, _ := ci.GetInfo()
		return migUUID(d, giInfo.Id, ciInfo.Id)
	}
	t.Fatalf("GPU instance profile %d has no compute instance profile spanning it", id)
	return ""
}

// mockModel is one of go-nvml's mock cards.
type mockModel struct {
	config gpus.Config
	// names are NVIDIA's names of the card's GPU instance profiles, by ID.
	names map[int]string
	// slots is how many memory slots the mock's placements span.
	slots int
}

// mockModels are the mock cards the tests read.
var mockModels = map[string]mockModel{
	"A100-SXM4-40GB": {gpus.A100_SXM4_40GB, map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1g.5gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2g.10gb",
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3g.20gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4g.20gb",
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7g.40gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g.5gb+me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g.10gb",
	}, 8},
	"A100-SXM4-80GB": {gpus.A100_SXM4_80GB, map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1g.10gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2g.20gb",
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3g.40gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4g.40gb",
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7g.80gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g.10gb+me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g.20gb",
	}, 8},
	// The mock's H100 placements span 7 slots: its 7g and 3g placements
	// take 7 and 3 (a real H100's 8 and 4), its 1g.20gb ones 1 (2).
	"H100-SXM5-80GB": {gpus.H100_SXM5_80GB, map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1g.10gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2g.20gb",
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3g.40gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4g.40gb",
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7g.80gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g.10gb+me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g.20gb",
	}, 7},
}

// wantProfiles are the model's profiles as its profile and placement tables
// give them, by ID.
func (m mockModel) wantProfiles() []gpuinfo.MIGProfile {
	var profiles []gpuinfo.MIGProfile
	for _, id := range slices.Sorted(maps.Keys(m.names)) {
		info, placements := m.config.MIGProfiles.GpuInstanceProfiles[id], m.config.MIGProfiles.GpuInstancePlacements[id]
		p := gpuinfo.MIGProfile{
			Name: m.names[id], ID: id, Slices: int(info.SliceCount), Size: int(placements[0].Size),
			MemoryMiB: int64(info.MemorySizeMB), Multiprocessors: int(info.MultiprocessorCount),
		}
		for _, at := range placements {
			p.Starts = append(p.Starts, int(at.Start))
		}
		profiles = append(profiles, p)
	}
	return profiles
}

// scan discovers the cards of s, linked through NVSwitch, checking that
// their inventory is valid.
func scan(t *testing.T, s *server.Server) ([]discovery.Card, *NVML) {
	t.Helper()
	setTopology(s, nvSwitchTopology)
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	n.sysfsPCI = t.TempDir()
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	if err := discovery.Inventory(cards, gpuinfo.InventoryVersion2).Validate(); err != nil {
		t.Errorf("inventory is invalid: %v", err)
	}
	return cards, n
}

// migInstance is a MIG device to create: a GPU instance of a profile, by ID,
// at a start.
type migInstance struct{ profile, start int }

// TestMIGDiscovery: the geometry of the cards of a DGX in MIG mode is their
// model's profile and placement tables, and their MIG devices; cards not in
// MIG mode have none.
func TestMIGDiscovery(t *testing.T) {
	tests := []struct {
		name   string
		server *server.Server
		model  string
		// mig are the MIG devices of the cards in MIG mode, by index.
		mig map[int][]migInstance
	}{
		{"DGX A100", dgxa100.New(), "A100-SXM4-40GB", map[int][]migInstance{
			1: {{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4}, {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 2}},
			5: {{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0}},
			6: {},
		}},
		{"DGX H100", dgxh100.New(), "H100-SXM5-80GB", map[int][]migInstance{
			0: {{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 6}, {nvml.GPU_INSTANCE_PROFILE_2_SLICE, 4}},
			3: {{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 0}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 2}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			model := mockModels[tc.model]
			want := make([]*gpuinfo.MIG, len(tc.server.Devices))
			for i, instances := range tc.mig {
				d := mockCard(t, tc.server, i)
				want[i] = &gpuinfo.MIG{Slots: model.slots, Profiles: model.wantProfiles(), Instances: []gpuinfo.MIGInstance{}}
				uuids := make([]string, len(instances))
				for j, in := range instances {
					uuids[j] = createMIGDevice(t, d, in.profile, in.start)
				}
				for j, in := range instances {
					want[i].Instances = append(want[i].Instances, mockSlice(t, d, model.names[in.profile], in.start, uuids[j]))
				}
				slices.SortFunc(want[i].Instances, func(a, b gpuinfo.MIGInstance) int { return cmp.Compare(a.Start, b.Start) })
			}
			cards, _ := scan(t, tc.server)
			got := make([]*gpuinfo.MIG, len(cards))
			for i, c := range cards {
				got[i] = c.MIG
				if c.MIGEnabled != (want[i] != nil) || !c.Healthy {
					t.Errorf("card %d: MIG enabled %t, healthy %t; want MIG enabled %t, healthy", i, c.MIGEnabled, c.Healthy, want[i] != nil)
				}
			}
			if diff := gocmp.Diff(want, got); diff != "" {
				t.Errorf("MIG geometry by card (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestMIGEveryPlacement: a MIG device of each profile, alone at each start
// its table allows, is discovered there; and the extended mock then refuses
// every placement over its slots, and only those.
func TestMIGEveryPlacement(t *testing.T) {
	for _, name := range []string{"A100-SXM4-40GB", "H100-SXM5-80GB"} {
		model := mockModels[name]
		for _, id := range slices.Sorted(maps.Keys(model.names)) {
			for _, at := range model.config.MIGProfiles.GpuInstancePlacements[id] {
				t.Run(fmt.Sprintf("%s/%s@%d", name, model.names[id], at.Start), func(t *testing.T) {
					s, err := server.New(server.WithGPUs(model.config))
					if err != nil {
						t.Fatal(err)
					}
					d := mockCard(t, s, 0)
					uuid := createMIGDevice(t, d, id, int(at.Start))
					cards, _ := scan(t, s)
					if cards[0].MIG == nil {
						t.Fatal("no MIG geometry")
					}
					want := []gpuinfo.MIGInstance{mockSlice(t, d, model.names[id], int(at.Start), uuid)}
					if diff := gocmp.Diff(want, cards[0].MIG.Instances); diff != "" {
						t.Errorf("instances (-want,+got):\n%s", diff)
					}
					checkRefusals(t, d, model, at)
				})
			}
		}
	}
}

// checkRefusals creates a GPU instance at each placement of each of the
// model's profiles on d, which holds one at taken: the extended mock must
// refuse exactly those over taken's slots. Those it creates are destroyed.
func checkRefusals(t *testing.T, d *server.Device, model mockModel, taken nvml.GpuInstancePlacement) {
	t.Helper()
	for id, name := range model.names {
		info, _ := d.GetGpuInstanceProfileInfo(id)
		for _, at := range model.config.MIGProfiles.GpuInstancePlacements[id] {
			gi, ret := d.CreateGpuInstanceWithPlacement(&info, &at)
			if ret == nvml.SUCCESS {
				gi.Destroy()
			}
			if refused := ret == nvml.ERROR_INSUFFICIENT_RESOURCES; refused != overlap(at, taken) {
				t.Errorf("creating %s at %d (slots %d-%d) over one at %d-%d: %v", name, at.Start, at.Start, at.Start+at.Size-1, taken.Start, taken.Start+taken.Size-1, ret)
			}
		}
	}
}

// TestExtendedMockRefuses: the extended mock refuses a placement its
// profile's table does not list, or over another instance, as a card does.
func TestExtendedMockRefuses(t *testing.T) {
	tests := []struct {
		name    string
		present []migInstance
		profile int
		at      nvml.GpuInstancePlacement
		want    nvml.Return
	}{
		{"2g.10gb at an odd start", nil, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GpuInstancePlacement{Start: 1, Size: 2}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3g.20gb of the wrong size", nil, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GpuInstancePlacement{Start: 4, Size: 3}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g.5gb inside a 3g.20gb", []migInstance{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4}}, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GpuInstancePlacement{Start: 5, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"7g.40gb over a 1g.5gb", []migInstance{{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 6}}, nvml.GPU_INSTANCE_PROFILE_7_SLICE, nvml.GpuInstancePlacement{Start: 0, Size: 8}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3g.20gb beside a 3g.20gb", []migInstance{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0}}, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GpuInstancePlacement{Start: 4, Size: 4}, nvml.SUCCESS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := mockCard(t, dgxa100.New(), 0)
			for _, in := range tc.present {
				createGPUInstance(t, d, in.profile, in.start)
			}
			info, _ := d.GetGpuInstanceProfileInfo(tc.profile)
			if _, ret := d.CreateGpuInstanceWithPlacement(&info, &tc.at); ret != tc.want {
				t.Errorf("creating it: %v, want %v", ret, tc.want)
			}
		})
	}
}

// TestMIGInstanceWithoutComputeInstance: a GPU instance without a compute
// instance has no MIG device, so no container can use it: it is left out.
func TestMIGInstanceWithoutComputeInstance(t *testing.T) {
	s := dgxa100.New()
	d := mockCard(t, s, 0)
	uuid := createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2)
	createGPUInstance(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
	createGPUInstance(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	cards, _ := scan(t, s)
	want := []gpuinfo.MIGInstance{mockSlice(t, d, "2g.10gb", 2, uuid)}
	if diff := gocmp.Diff(want, cards[0].MIG.Instances); diff != "" {
		t.Errorf("instances (-want,+got):\n%s", diff)
	}
}

// TestMIGDeviceIndex: an instance's index is the one NVML lists its MIG
// device under, also past an index without one.
func TestMIGDeviceIndex(t *testing.T) {
	s := dgxa100.New()
	d := mockCard(t, s, 0)
	first := createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	second := createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
	handle := d.GetMigDeviceHandleByIndexFunc
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return handle(i - 1)
	}
	cards, _ := scan(t, s)
	want := []gpuinfo.MIGInstance{
		{Profile: "1g.5gb", Start: 0, UUID: second, Index: 2, GPUInstance: 1, Healthy: true},
		{Profile: "3g.20gb", Start: 4, UUID: first, Index: 1, GPUInstance: 0, Healthy: true},
	}
	if diff := gocmp.Diff(want, cards[0].MIG.Instances); diff != "" {
		t.Errorf("instances (-want,+got):\n%s", diff)
	}
}

// TestMIGProfileNames: profiles are named with their variant's suffix, and
// of two with one name the one of lower ID is kept.
func TestMIGProfileNames(t *testing.T) {
	config := gpus.A100_SXM4_40GB
	profiles := maps.Clone(config.MIGProfiles.GpuInstanceProfiles)
	placements := maps.Clone(config.MIGProfiles.GpuInstancePlacements)
	for id, like := range map[int]int{
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   nvml.GPU_INSTANCE_PROFILE_2_SLICE,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    nvml.GPU_INSTANCE_PROFILE_1_SLICE,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    nvml.GPU_INSTANCE_PROFILE_4_SLICE,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  nvml.GPU_INSTANCE_PROFILE_1_SLICE,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: nvml.GPU_INSTANCE_PROFILE_1_SLICE,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    nvml.GPU_INSTANCE_PROFILE_3_SLICE,
	} {
		info := profiles[like]
		info.Id = uint32(id)
		profiles[id], placements[id] = info, placements[like]
	}
	config.MIGProfiles.GpuInstanceProfiles, config.MIGProfiles.GpuInstancePlacements = profiles, placements
	// Without placements, a profile is left out.
	profiles[nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME] = nvml.GpuInstanceProfileInfo{Id: nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, SliceCount: 2, MemorySizeMB: 9856}
	s, err := server.New(server.WithGPUs(config))
	if err != nil {
		t.Fatal(err)
	}
	mockCard(t, s, 0)
	cards, _ := scan(t, s)
	got := map[int]string{}
	for _, p := range cards[0].MIG.Profiles {
		got[p.ID] = p.Name
	}
	want := map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: "1g.5gb", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "2g.10gb",
		nvml.GPU_INSTANCE_PROFILE_3_SLICE: "3g.20gb", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "4g.20gb",
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: "7g.40gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "1g.5gb+me",
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1: "2g.10gb+me", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "1g.10gb",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX: "1g.5gb+gfx", nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX: "4g.20gb+gfx",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "1g.5gb-me", nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX: "3g.20gb+gfx",
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("profile names by ID (-want,+got):\n%s", diff)
	}
}

// TestSimulatedMIGMatchesNVML: the simulated backend's MIG profiles are
// those NVML discovery reads from go-nvml's mock of the same card.
func TestSimulatedMIGMatchesNVML(t *testing.T) {
	for _, tc := range []struct{ simulated, mock string }{
		{"A100-40GB", "A100-SXM4-40GB"},
		{"A100-80GB", "A100-SXM4-80GB"},
	} {
		t.Run(tc.simulated, func(t *testing.T) {
			sim, err := discovery.NewSimulated("n", "1x"+tc.simulated+":mig=")
			if err != nil {
				t.Fatal(err)
			}
			simCards, _ := sim.Cards()
			s, err := server.New(server.WithGPUs(mockModels[tc.mock].config))
			if err != nil {
				t.Fatal(err)
			}
			mockCard(t, s, 0)
			cards, _ := scan(t, s)
			want, got := simCards[0].MIG, cards[0].MIG
			if want.Slots != got.Slots {
				t.Errorf("slots: simulated %d, NVML %d", want.Slots, got.Slots)
			}
			for _, p := range want.Profiles {
				read := got.Profile(p.Name)
				if read == nil {
					t.Errorf("profile %s: simulated, not read through NVML", p.Name)
					continue
				}
				if diff := gocmp.Diff(p, *read); diff != "" {
					t.Errorf("profile %s (-simulated,+NVML):\n%s", p.Name, diff)
				}
			}
		})
	}
}

// TestMIGGeometryUnreadable: when NVML cannot give a card's geometry, or
// gives one that is not valid, the card stays in MIG mode and healthy
// without one (it takes no pods) and the reason is kept for the log.
func TestMIGGeometryUnreadable(t *testing.T) {
	tests := []struct {
		name  string
		fault func(d *server.Device)
	}{
		{"profile unreadable", func(d *server.Device) {
			d.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_UNKNOWN
			}
		}},
		{"placements unreadable", func(d *server.Device) {
			d.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
		}},
		{"placements of two sizes", func(d *server.Device) {
			d.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				return []nvml.GpuInstancePlacement{{Start: 0, Size: 2}, {Start: 4, Size: 4}}, nvml.SUCCESS
			}
		}},
		{"MIG devices uncountable", func(d *server.Device) {
			d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		}},
		{"GPU instances unlisted", func(d *server.Device) {
			d.GetGpuInstancesFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
				return nil, nvml.ERROR_UNKNOWN
			}
		}},
		{"a profile larger than the card", func(d *server.Device) {
			d.GetGpuInstanceProfileInfoFunc = func(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				info, ok := d.Config.MIGProfiles.GpuInstanceProfiles[id]
				if !ok {
					return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
				}
				info.MemorySizeMB *= 2
				return info, nvml.SUCCESS
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := dgxa100.New()
			d := mockCard(t, s, 2)
			createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
			tc.fault(d)
			cards, n := scan(t, s)
			if c := cards[2]; !c.MIGEnabled || !c.Healthy || c.MIG != nil {
				t.Errorf("card 2: MIG enabled %t, healthy %t, geometry %+v; want MIG enabled, healthy, no geometry", c.MIGEnabled, c.Healthy, c.MIG)
			}
			if n.migProblems[2] == "" {
				t.Error("no reason kept for the log")
			}
		})
	}
}

// TestMIGGeometryReadAgain: a card's geometry is back, and the reason it was
// left out forgotten, once NVML gives it again.
func TestMIGGeometryReadAgain(t *testing.T) {
	s := dgxa100.New()
	d := mockCard(t, s, 0)
	uuid := createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	count := d.GetMaxMigDeviceCountFunc
	broken := true
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if broken {
			return 0, nvml.ERROR_UNKNOWN
		}
		return count()
	}
	cards, n := scan(t, s)
	if cards[0].MIG != nil || n.migProblems[0] == "" {
		t.Fatalf("while NVML fails: geometry %+v, reasons %v", cards[0].MIG, n.migProblems)
	}
	broken = false
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	want := []gpuinfo.MIGInstance{mockSlice(t, d, "3g.20gb", 0, uuid)}
	if cards[0].MIG == nil {
		t.Fatal("no geometry once NVML gives it again")
	}
	if diff := gocmp.Diff(want, cards[0].MIG.Instances); diff != "" {
		t.Errorf("instances once NVML gives them again (-want,+got):\n%s", diff)
	}
	if len(n.migProblems) != 0 {
		t.Errorf("reasons kept once the geometry is read: %v", n.migProblems)
	}
}

// TestMIGInstancesFollowCardHealth: a card's MIG devices are as healthy as
// the card, also when it falls off the bus and is reported under its last
// reading.
func TestMIGInstancesFollowCardHealth(t *testing.T) {
	s := dgxa100.New()
	for i := range 2 {
		d := mockCard(t, s, i)
		createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 0)
		createMIGDevice(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	}
	// Card 1's name cannot be read: it is unhealthy.
	s.Devices[1].(*server.Device).GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	lost := loseCards(s)
	before, n := scan(t, s)
	lost[0] = true
	after, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		card discovery.Card
		want bool
	}{
		{"card 0", before[0], true},
		{"card 1, unhealthy", before[1], false},
		{"card 0, off the bus", after[0], false},
	} {
		if tc.card.Healthy != tc.want || tc.card.MIG == nil {
			t.Errorf("%s: healthy %t, geometry %+v; want healthy %t with geometry", tc.name, tc.card.Healthy, tc.card.MIG, tc.want)
			continue
		}
		for _, in := range tc.card.MIG.Instances {
			if in.Healthy != tc.want {
				t.Errorf("%s: instance %s@%d healthy %t, want %t", tc.name, in.Profile, in.Start, in.Healthy, tc.want)
			}
		}
	}
}
