package discovery

import (
	"fmt"
	"math"
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

// simulatedGeometry is the MIG geometry of a simulated card of the given
// kind with the listed instances, "PROFILE[@START]" each: an instance
// without a start takes the first free one its profile allows, in order.
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
	var taken [gpuinfo.MaxMIGSlots]bool
	for _, text := range instances {
		name, startText, explicit := strings.Cut(text, "@")
		p := m.Profile(name)
		if p == nil {
			return nil, fmt.Errorf("MIG instance %q: model %s has no profile %q", text, kind, name)
		}
		start := -1
		for _, s := range p.Starts {
			if explicit && strconv.Itoa(s) != startText {
				continue
			}
			if free(taken[:], s, p.Size) {
				start = s
				break
			}
		}
		if start < 0 {
			return nil, fmt.Errorf("MIG instance %q: no free placement for it on a %s", text, kind)
		}
		for s := start; s < start+p.Size; s++ {
			taken[s] = true
		}
		m.Instances = append(m.Instances, gpuinfo.MIGInstance{
			Profile: name, Start: start, UUID: fmt.Sprintf("MIG-sim-%s-%d-%d", node, index, start), Index: len(m.Instances), Healthy: true,
		})
	}
	return m, nil
}

func free(taken []bool, start, size int) bool {
	for s := start; s < start+size; s++ {
		if taken[s] {
			return false
		}
	}
	return true
}
