package discovery

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// knownModels maps the short names accepted by the simulated backend to
// their product names and memory.
var knownModels = map[string]struct {
	model     string
	memoryMiB int64
}{
	"A100-80GB":  {"NVIDIA A100-SXM4-80GB", 81920},
	"A100-40GB":  {"NVIDIA A100-SXM4-40GB", 40960},
	"H100-80GB":  {"NVIDIA H100 80GB HBM3", 81920},
	"H200-141GB": {"NVIDIA H200", 143771},
	"L4-24GB":    {"NVIDIA L4", 23034},
	"T4-16GB":    {"Tesla T4", 15360},
}

// Simulated is a backend whose cards are described by a spec such as
// "8xA100-80GB" or "4xT4-16GB,2xL4-24GB". A model not in the table is taken
// as "<name>-<N>GB" with N GiB of memory. Cards in MIG mode list their MIG
// instances after a colon, "+" between them, each "PROFILE[@START]":
// "1xA100-40GB:mig=3g.20gb+1g.5gb+1g.5gb@6" (an empty list, "mig=", is MIG
// mode without instances). UUIDs derive from the node name, so they are
// stable across restarts.
type Simulated struct {
	cards []Card

	mu    sync.Mutex
	usage map[int]SimulatedUsage
}

// NewSimulated parses spec for the named node.
func NewSimulated(node, spec string) (*Simulated, error) {
	s := &Simulated{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		countText, kind, ok := strings.Cut(part, "x")
		count, err := strconv.Atoi(countText)
		if !ok || err != nil || count < 1 {
			return nil, fmt.Errorf("simulated GPUs %q: want COUNTxMODEL-MEMORYGB, e.g. 8xA100-80GB", part)
		}
		kind, migSpec, inMIG := strings.Cut(kind, ":")
		model, memoryMiB, err := parseKind(kind)
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
		}
		instances, err := parseMIGSpec(migSpec, inMIG)
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
		}
		for i := 0; i < count; i++ {
			index := len(s.cards)
			c := Card{
				Index: index, Minor: index, UUID: fmt.Sprintf("GPU-sim-%s-%d", node, index), Model: model,
				MemoryMiB: memoryMiB, NUMANode: -1, Healthy: true, MIGEnabled: inMIG,
			}
			if inMIG {
				if c.MIG, err = simulatedGeometry(node, index, kind, memoryMiB, instances); err != nil {
					return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
				}
			}
			s.cards = append(s.cards, c)
		}
	}
	return s, nil
}

// parseMIGSpec reads "mig=PROFILE[@START]+...", what follows a model's colon.
func parseMIGSpec(spec string, present bool) ([]string, error) {
	if !present {
		return nil, nil
	}
	list, ok := strings.CutPrefix(spec, "mig=")
	if !ok {
		return nil, fmt.Errorf("%q: want mig=PROFILE[@START]+..., e.g. mig=3g.20gb+1g.5gb", spec)
	}
	if list == "" {
		return nil, nil
	}
	return strings.Split(list, "+"), nil
}

func parseKind(kind string) (string, int64, error) {
	if m, ok := knownModels[kind]; ok {
		return m.model, m.memoryMiB, nil
	}
	i := strings.LastIndex(kind, "-")
	if i <= 0 || !strings.HasSuffix(kind, "GB") {
		return "", 0, fmt.Errorf("model %q: want NAME-<N>GB", kind)
	}
	gib, err := strconv.ParseInt(strings.TrimSuffix(kind[i+1:], "GB"), 10, 64)
	if err != nil || gib < 1 {
		return "", 0, fmt.Errorf("model %q: memory must be a whole number of GB", kind)
	}
	return kind[:i], gib * 1024, nil
}

// Name describes the backend.
func (s *Simulated) Name() string { return fmt.Sprintf("simulated (%d cards)", len(s.cards)) }

// Cards returns a copy of the simulated cards.
func (s *Simulated) Cards() ([]Card, error) { return append([]Card(nil), s.cards...), nil }

// Close does nothing.
func (s *Simulated) Close() error { return nil }

// SimulatedUsage is what a simulated card reports as in use: tests set it to
// check what the agent makes of a card's live statistics.
type SimulatedUsage struct {
	// Utilization is the GPU utilisation, 0-1.
	Utilization  float64
	TemperatureC float64
	// Containers is the GPU memory each container's processes use, by
	// container ID (without the runtime's "containerd://" prefix).
	Containers map[string]int64
	// OtherMiB is memory used by processes of no known container.
	OtherMiB int64
}

// SetUsage sets what card index reports from now on; its used memory is the
// sum of Containers and OtherMiB.
func (s *Simulated) SetUsage(index int, u SimulatedUsage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.usage == nil {
		s.usage = map[int]SimulatedUsage{}
	}
	u.Containers = maps.Clone(u.Containers)
	s.usage[index] = u
}

// Stats reports each card's usage as SetUsage set it; a card without one is
// idle at 30 °C. Each container appears as one process, named by its
// container ID; OtherMiB as one process of PID 0 and no container.
func (s *Simulated) Stats() ([]CardStats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	stats := make([]CardStats, 0, len(s.cards))
	for _, c := range s.cards {
		u, ok := s.usage[c.Index]
		if !ok {
			u.TemperatureC = 30
		}
		st := CardStats{Index: c.Index, UUID: c.UUID, Utilization: u.Utilization, TemperatureC: u.TemperatureC, ProcessesKnown: true, Processes: []Process{}}
		for _, id := range slices.Sorted(maps.Keys(u.Containers)) {
			st.Processes = append(st.Processes, Process{ContainerID: id, MemoryUsedMiB: u.Containers[id]})
			st.MemoryUsedMiB += u.Containers[id]
		}
		if u.OtherMiB > 0 {
			st.Processes = append(st.Processes, Process{MemoryUsedMiB: u.OtherMiB})
			st.MemoryUsedMiB += u.OtherMiB
		}
		stats = append(stats, st)
	}
	return stats, nil
}
