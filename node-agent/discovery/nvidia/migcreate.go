package nvidia

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// CreateMIGSlice creates, on card index, a GPU instance of the named profile
// at start and a compute instance spanning it, and returns its MIG device's
// UUID. When the compute instance cannot be created, or its MIG device not
// found, the GPU instance is destroyed again. It never changes MIG mode.
func (n *NVML) CreateMIGSlice(index int, profile string, start int) (string, error) {
	uuid, err := n.createMIGSlice(index, profile, start)
	if err != nil {
		return "", fmt.Errorf("creating MIG slice %s@%d on card %d: %w", profile, start, index, err)
	}
	return uuid, nil
}

// createMIGSlice does CreateMIGSlice's work; its errors do not name the
// slice.
func (n *NVML) createMIGSlice(index int, profile string, start int) (string, error) {
	dev, p, err := n.migCardProfile(index, profile)
	if err != nil {
		return "", err
	}
	if p == nil {
		return "", fmt.Errorf("the card has no MIG profile %q", profile)
	}
	if !slices.Contains(p.profile.Starts, start) {
		return "", fmt.Errorf("profile %s cannot start at slot %d (its starts: %v)", profile, start, p.profile.Starts)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&p.info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.profile.Size)})
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("creating its GPU instance: %s", n.lib.ErrorString(ret))
	}
	uuid, err := n.fillGPUInstance(dev, gi, p.info.SliceCount)
	if err != nil {
		if undo := n.destroyGPUInstance(gi); undo != nil {
			err = fmt.Errorf("%w; destroying its GPU instance again: %w", err, undo)
		}
		return "", err
	}
	return uuid, nil
}

// fillGPUInstance creates in gi, a GPU instance of dev with sliceCount
// compute slices, a compute instance spanning it, and returns the UUID of the MIG
// device it makes.
func (n *NVML) fillGPUInstance(dev nvml.Device, gi nvml.GpuInstance, sliceCount uint32) (string, error) {
	info, err := spanningComputeProfile(gi, sliceCount)
	if err != nil {
		return "", err
	}
	if _, ret := gi.CreateComputeInstance(&info); ret != nvml.SUCCESS {
		return "", fmt.Errorf("creating its compute instance: %s", n.lib.ErrorString(ret))
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("reading its GPU instance: %s", n.lib.ErrorString(ret))
	}
	devices, err := migDevices(dev)
	if err != nil {
		return "", err
	}
	mig, ok := devices[int(giInfo.Id)]
	if !ok {
		return "", fmt.Errorf("NVML lists no MIG device of its GPU instance %d", giInfo.Id)
	}
	return mig.uuid, nil
}

// spanningComputeProfile is the shared compute instance profile of gi that
// spans its sliceCount compute slices.
func spanningComputeProfile(gi nvml.GpuInstance, sliceCount uint32) (nvml.ComputeInstanceProfileInfo, error) {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.SliceCount == sliceCount {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("its GPU instance offers no compute instance profile of %d slices", sliceCount)
}

// DestroyMIGSlice destroys the GPU instance of the named profile at start on
// card index, its compute instances first. A card not in MIG mode, or
// without such a profile or GPU instance, has nothing to destroy. It never
// changes MIG mode.
func (n *NVML) DestroyMIGSlice(index int, profile string, start int) error {
	if err := n.destroyMIGSlice(index, profile, start); err != nil {
		return fmt.Errorf("destroying MIG slice %s@%d on card %d: %w", profile, start, index, err)
	}
	return nil
}

// destroyMIGSlice does DestroyMIGSlice's work; its errors do not name the
// slice.
func (n *NVML) destroyMIGSlice(index int, profile string, start int) error {
	dev, p, err := n.migCardProfile(index, profile)
	if errors.Is(err, errNotInMIGMode) || err == nil && p == nil {
		return nil
	}
	if err != nil {
		return err
	}
	gis, ret := dev.GetGpuInstances(&p.info)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("listing the GPU instances of profile %s: %s", profile, n.lib.ErrorString(ret))
	}
	for _, gi := range gis {
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("reading a GPU instance of profile %s: %s", profile, n.lib.ErrorString(ret))
		}
		if int(info.Placement.Start) == start {
			return n.destroyGPUInstance(gi)
		}
	}
	return nil
}

// destroyGPUInstance destroys gi's compute instances, of every shared
// profile, then gi.
func (n *NVML) destroyGPUInstance(gi nvml.GpuInstance) error {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("listing its compute instances of profile %d: %s", id, n.lib.ErrorString(ret))
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("destroying a compute instance: %s", n.lib.ErrorString(ret))
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroying its GPU instance: %s", n.lib.ErrorString(ret))
	}
	return nil
}

// errNotInMIGMode is migCardProfile's error for a card not in MIG mode.
var errNotInMIGMode = errors.New("the card is not in MIG mode")

// migCardProfile returns the handle of card index, which must be in MIG
// mode, and its GPU instance profile of the given name, as discovery names
// it; no profile when it has none of that name.
func (n *NVML) migCardProfile(index int, profile string) (nvml.Device, *migProfile, error) {
	dev, ret := n.lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("getting the card's handle: %s", n.lib.ErrorString(ret))
	}
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("reading the card's MIG mode: %s", n.lib.ErrorString(ret))
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		return nil, nil, errNotInMIGMode
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("reading the card's memory: %s", n.lib.ErrorString(ret))
	}
	profiles, err := readMIGProfiles(dev, int64(mem.Total/(1<<20)))
	if err != nil {
		return nil, nil, err
	}
	i := slices.IndexFunc(profiles, func(p migProfile) bool { return p.profile.Name == profile })
	if i < 0 {
		return dev, nil, nil
	}
	return dev, &profiles[i], nil
}
