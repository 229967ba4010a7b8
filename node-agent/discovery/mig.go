package discovery

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// MIGProfileName is NVIDIA's name for a GPU instance profile: its compute
// slices, "g.", and its memory in GB — the card's memory in GB times the
// profile's share of it rounded up to eighths, as nvidia-smi names them
// (4864 MiB of a 40 GiB A100 is 1g.5gb) — then suffix, such as "+me".
func MIGProfileName(slices int, memoryMiB, cardMemoryMiB int64, suffix string) string {
	cardGB := math.Round(float64(cardMemoryMiB) / 1024)
	eighths := math.Ceil(float64(memoryMiB) * 8 / float64(cardMemoryMiB))
	gb := int64(math.Round(eighths / 8 * cardGB))
	return strconv.Itoa(slices) + "g." + strconv.FormatInt(gb, 10) + "gb" + suffix
}

// simulatedMIGProfile is one profile of a simulated card: slices, memory
// slots and their starts, memory and multiprocessors, as NVIDIA's MIG user
// guide lists them (the tests compare them with go-nvml's mock cards).
type simulatedMIGProfile struct {
	id, slices, size int
	memoryMiB        int64
	multiprocessors  int
	starts           []int
}

// simulatedMIG are the MIG profiles of the simulated models that have them,
// with the number of memory slots.
var simulatedMIG = map[string]struct {
	slots    int
	profiles []simulatedMIGProfile
}{
	"A100-40GB": {8, []simulatedMIGProfile{
		{0, 1, 1, 4864, 14, []int{0, 1, 2, 3, 4, 5, 6}},
		{9, 1, 2, 9856, 14, []int{0, 2, 4, 6}},
		{1, 2, 2, 9856, 28, []int{0, 2, 4}},
		{2, 3, 4, 19968, 42, []int{0, 4}},
		{3, 4, 4, 19968, 56, []int{0}},
		{4, 7, 8, 40192, 98, []int{0}},
	}},
	"A100-80GB": {8, []simulatedMIGProfile{
		{0, 1, 1, 9856, 14, []int{0, 1, 2, 3, 4, 5, 6}},
		{9, 1, 2, 19968, 14, []int{0, 2, 4, 6}},
		{1, 2, 2, 19968, 28, []int{0, 2, 4}},
		{2, 3, 4, 40192, 42, []int{0, 4}},
		{3, 4, 4, 40192, 56, []int{0}},
		{4, 7, 8, 80384, 98, []int{0}},
	}},
}

// simulatedGeometry is the MIG geometry of simulated card index of node, a
// card of the given kind, with the listed instances, "PROFILE[@START]" each:
// an instance without a start takes the first free one its profile allows,
// in order.
func simulatedGeometry(node string, index int, kind string, memoryMiB int64, instances []string) (*gpuinfo.MIG, error) {
	table, ok := simulatedMIG[kind]
	if !ok {
		return nil, fmt.Errorf("model %s: no MIG profiles known (simulated: A100-40GB, A100-80GB)", kind)
	}
	m := &gpuinfo.MIG{Slots: table.slots, Profiles: []gpuinfo.MIGProfile{}, Instances: []gpuinfo.MIGInstance{}}
	for _, p := range table.profiles {
		m.Profiles = append(m.Profiles, gpuinfo.MIGProfile{
			Name: MIGProfileName(p.slices, p.memoryMiB, memoryMiB, ""), ID: p.id, Slices: p.slices, Size: p.size,
			MemoryMiB: p.memoryMiB, Multiprocessors: p.multiprocessors, Starts: p.starts,
		})
	}
	for _, text := range instances {
		name, startText, explicit := strings.Cut(text, "@")
		start, err := specStart(m, name, startText, explicit)
		if err == nil {
			_, err = addInstance(m, node, index, name, start)
		}
		if err != nil {
			return nil, fmt.Errorf("MIG instance %q on a %s: %w", text, kind, err)
		}
	}
	return m, nil
}

// specStart is the start of a listed instance of the named profile on m:
// startText when explicit, else the first start the profile allows whose
// slots are free.
func specStart(m *gpuinfo.MIG, name, startText string, explicit bool) (int, error) {
	if explicit {
		start, err := strconv.Atoi(startText)
		if err != nil {
			return 0, fmt.Errorf("start %q is not a slot number", startText)
		}
		return start, nil
	}
	p := m.Profile(name)
	if p == nil {
		return 0, fmt.Errorf("no profile %q", name)
	}
	taken := takenSlots(m)
	for _, s := range p.Starts {
		if free(taken[:], s, p.Size) {
			return s, nil
		}
	}
	return 0, fmt.Errorf("no free placement for profile %s", name)
}

// addInstance adds to m, the geometry of simulated card index of node, an
// instance of the named profile at start, with the lowest MIG device index
// the card does not use, and returns it. It fails when m has no such
// profile, the profile cannot start there, or another instance takes one of
// its slots.
func addInstance(m *gpuinfo.MIG, node string, index int, profile string, start int) (gpuinfo.MIGInstance, error) {
	p := m.Profile(profile)
	if p == nil {
		return gpuinfo.MIGInstance{}, fmt.Errorf("no profile %q", profile)
	}
	if !slices.Contains(p.Starts, start) {
		return gpuinfo.MIGInstance{}, fmt.Errorf("profile %s cannot start at slot %d (its starts: %v)", profile, start, p.Starts)
	}
	if taken := takenSlots(m); !free(taken[:], start, p.Size) {
		return gpuinfo.MIGInstance{}, fmt.Errorf("profile %s at slot %d: slots %d-%d are not all free", profile, start, start, start+p.Size-1)
	}
	device := freeIndex(m)
	in := gpuinfo.MIGInstance{
		Profile: profile, Start: start, UUID: fmt.Sprintf("MIG-sim-%s-%d-%d", node, index, start), Index: device,
		GPUInstance: device + 1, Healthy: true,
	}
	m.Instances = append(m.Instances, in)
	return in, nil
}

// takenSlots marks the slots m's instances take.
func takenSlots(m *gpuinfo.MIG) [gpuinfo.MaxMIGSlots]bool {
	var taken [gpuinfo.MaxMIGSlots]bool
	for _, in := range m.Instances {
		if p := m.Profile(in.Profile); p != nil {
			for s := in.Start; s < in.Start+p.Size; s++ {
				taken[s] = true
			}
		}
	}
	return taken
}

// freeIndex is the lowest MIG device index no instance of m has.
func freeIndex(m *gpuinfo.MIG) int {
	for i := 0; ; i++ {
		if !slices.ContainsFunc(m.Instances, func(in gpuinfo.MIGInstance) bool { return in.Index == i }) {
			return i
		}
	}
}

// free reports whether none of the size slots from start is taken.
func free(taken []bool, start, size int) bool {
	for s := start; s < start+size; s++ {
		if taken[s] {
			return false
		}
	}
	return true
}
