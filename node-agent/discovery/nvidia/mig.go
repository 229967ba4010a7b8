package nvidia

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// migSuffixes end the names of the GPU instance profiles that vary another
// of the same slices and memory: with media extensions ("+me"), with
// graphics ("+gfx"), or without media engines ("-me").
var migSuffixes = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:  "+me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:  "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:   "+gfx",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:   "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:   "+gfx",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:   "+gfx",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: "-me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: "-me",
}

// migProfile is a GPU instance profile as NVML describes it and as the
// inventory lists it.
type migProfile struct {
	info    nvml.GpuInstanceProfileInfo
	profile gpuinfo.MIGProfile
}

// migGeometry reads the MIG geometry of card c, which is in MIG mode, through
// its handle dev. It returns nil when the geometry cannot be read or is not
// valid (the card then takes no pods, but stays healthy), and logs why once
// until the reason changes.
func (n *NVML) migGeometry(c discovery.Card, dev nvml.Device) *gpuinfo.MIG {
	m, err := readMIG(dev, c.MemoryMiB, c.Healthy)
	if err == nil {
		c.MIG = m
		if err = discovery.Inventory([]discovery.Card{c}, gpuinfo.InventoryVersion2).Validate(); err != nil {
			err = fmt.Errorf("the geometry read is not valid: %w", err)
		}
	}
	n.noteMIGProblem(c, err)
	if err != nil {
		return nil
	}
	return m
}

// noteMIGProblem logs err, why card c's MIG geometry is left out, when it
// differs from the card's last one; nil forgets the last one.
func (n *NVML) noteMIGProblem(c discovery.Card, err error) {
	if err == nil {
		delete(n.migProblems, c.Index)
		return
	}
	if n.migProblems[c.Index] == err.Error() {
		return
	}
	n.migProblems[c.Index] = err.Error()
	klog.Background().Error(err, "Card in MIG mode takes no pods: its MIG geometry could not be read", "index", c.Index, "uuid", c.UUID)
}

// readMIG reads the MIG geometry of dev, a card in MIG mode with
// cardMemoryMiB of memory: the profiles it offers, by ID, and its MIG
// devices, by start, healthy when the card is.
func readMIG(dev nvml.Device, cardMemoryMiB int64, healthy bool) (*gpuinfo.MIG, error) {
	profiles, err := readMIGProfiles(dev, cardMemoryMiB)
	if err != nil {
		return nil, err
	}
	devices, err := migDevices(dev)
	if err != nil {
		return nil, err
	}
	m := &gpuinfo.MIG{Profiles: make([]gpuinfo.MIGProfile, 0, len(profiles)), Instances: []gpuinfo.MIGInstance{}}
	for _, p := range profiles {
		m.Profiles = append(m.Profiles, p.profile)
		m.Slots = max(m.Slots, p.profile.Starts[len(p.profile.Starts)-1]+p.profile.Size)
		instances, err := readMIGInstances(dev, p, devices, healthy)
		if err != nil {
			return nil, err
		}
		m.Instances = append(m.Instances, instances...)
	}
	slices.SortFunc(m.Instances, func(a, b gpuinfo.MIGInstance) int { return cmp.Compare(a.Start, b.Start) })
	return m, nil
}

// readMIGProfiles lists the GPU instance profiles dev offers, by ID; of two
// profiles with one name, the first is kept (and the instances of the other
// are not read).
func readMIGProfiles(dev nvml.Device, cardMemoryMiB int64) ([]migProfile, error) {
	var profiles []migProfile
	names := map[string]bool{}
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		p, offered, err := readMIGProfile(dev, id, cardMemoryMiB)
		if err != nil {
			return nil, err
		}
		if !offered || names[p.profile.Name] {
			continue
		}
		names[p.profile.Name] = true
		profiles = append(profiles, p)
	}
	return profiles, nil
}

// readMIGProfile reads GPU instance profile id of dev, named as nvidia-smi
// names it; false when the card does not offer it or it has no placement.
func readMIGProfile(dev nvml.Device, id int, cardMemoryMiB int64) (migProfile, bool, error) {
	info, ret := dev.GetGpuInstanceProfileInfo(id)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		return migProfile{}, false, nil
	default:
		return migProfile{}, false, fmt.Errorf("reading GPU instance profile %d: %w", id, ret)
	}
	placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return migProfile{}, false, fmt.Errorf("reading the placements of GPU instance profile %d: %w", id, ret)
	}
	if len(placements) == 0 {
		return migProfile{}, false, nil
	}
	starts := make([]int, 0, len(placements))
	for _, p := range placements {
		if p.Size != placements[0].Size {
			return migProfile{}, false, fmt.Errorf("GPU instance profile %d: placements of sizes %d and %d", id, placements[0].Size, p.Size)
		}
		starts = append(starts, int(p.Start))
	}
	slices.Sort(starts)
	return migProfile{info: info, profile: gpuinfo.MIGProfile{
		Name:            discovery.MIGProfileName(int(info.SliceCount), int64(info.MemorySizeMB), cardMemoryMiB, migSuffixes[id]),
		ID:              id,
		Slices:          int(info.SliceCount),
		Size:            int(placements[0].Size),
		MemoryMiB:       int64(info.MemorySizeMB),
		Multiprocessors: int(info.MultiprocessorCount),
		Starts:          starts,
	}}, true, nil
}

// migDevice is a MIG device as the inventory names it: its UUID and its
// index under its card, as NVML lists it (the toolkit's CDI "CARD:INDEX").
type migDevice struct {
	uuid  string
	index int
	// computeInstance is its compute instance's ID.
	computeInstance int
}

// migDevices maps the ID of each GPU instance of dev that holds a MIG device
// (a compute instance) to that device; of a GPU instance split into several,
// the first NVML lists. A MIG device NVML cannot describe is left out.
func migDevices(dev nvml.Device) (map[int]migDevice, error) {
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting MIG devices: %w", ret)
	}
	devices := make(map[int]migDevice, count)
	for i := 0; i < count; i++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS { // ERROR_NOT_FOUND: no MIG device at i
			continue
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := mig.GetUUID()
		if _, seen := devices[gi]; ret != nvml.SUCCESS || uuid == "" || seen {
			continue
		}
		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		devices[gi] = migDevice{uuid: uuid, index: i, computeInstance: ci}
	}
	return devices, nil
}

// readMIGInstances lists dev's GPU instances of profile p that hold a MIG
// device, which devices gives by GPU instance ID; a GPU instance without one
// (no compute instance) is left out, as no container can use it.
func readMIGInstances(dev nvml.Device, p migProfile, devices map[int]migDevice, healthy bool) ([]gpuinfo.MIGInstance, error) {
	gis, ret := dev.GetGpuInstances(&p.info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("listing the GPU instances of profile %s: %w", p.profile.Name, ret)
	}
	var instances []gpuinfo.MIGInstance
	for _, gi := range gis {
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("reading a GPU instance of profile %s: %w", p.profile.Name, ret)
		}
		if mig, ok := devices[int(info.Id)]; ok {
			instances = append(instances, gpuinfo.MIGInstance{
				Profile: p.profile.Name, Start: int(info.Placement.Start), UUID: mig.uuid, Index: mig.index,
				GPUInstance: int(info.Id), ComputeInstance: mig.computeInstance, Healthy: healthy,
			})
		}
	}
	return instances, nil
}

// withUnhealthyInstances returns a copy of m whose instances are all
// unhealthy, as a card's are once it is; nil for nil.
func withUnhealthyInstances(m *gpuinfo.MIG) *gpuinfo.MIG {
	if m == nil {
		return nil
	}
	c := *m
	c.Instances = slices.Clone(m.Instances)
	for i := range c.Instances {
		c.Instances[i].Healthy = false
	}
	return &c
}
