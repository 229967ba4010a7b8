package discovery

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
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
// mode without instances); "mig-dynamic=" instead of "mig=" makes the cards
// dynamic (Card.MIGDynamic), their slices created and destroyed through the
// backend's MIGController methods. A part "topology=SHAPE" gives the node's
// cards the links of a topology.Shapes shape, e.g.
// "8xH100-80GB,topology=nvlink-quads". UUIDs derive from the node name, so they
// are stable across restarts.
type Simulated struct {
	node string

	// mu guards the cards' MIG instances, the usage and migFailure.
	mu    sync.Mutex
	cards []Card
	usage map[int]SimulatedUsage
	// migFailure, when set, is why every slice creation fails.
	migFailure string
}

// SetMIGFailure makes every slice creation fail, with reason, from now on, as
// a driver would that cannot make one (tests); "" lets them succeed again.
func (s *Simulated) SetMIGFailure(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.migFailure = reason
}

// NewSimulated parses spec for the named node.
func NewSimulated(node, spec string) (*Simulated, error) {
	s := &Simulated{node: node}
	shape := ""
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if v, ok := strings.CutPrefix(part, "topology="); ok {
			if !topology.Valid(v) {
				return nil, fmt.Errorf("simulated GPUs %q: want topology=%s", part, strings.Join(topology.Shapes, "|"))
			}
			shape = v
			continue
		}
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
		instances, dynamic, err := parseMIGSpec(migSpec, inMIG)
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
		}
		for i := 0; i < count; i++ {
			index := len(s.cards)
			c := Card{
				Index: index, Minor: index, UUID: fmt.Sprintf("GPU-sim-%s-%d", node, index), Model: model,
				MemoryMiB: memoryMiB, NUMANode: -1, Healthy: true, MIGEnabled: inMIG, MIGDynamic: dynamic,
			}
			if inMIG {
				if c.MIG, err = simulatedGeometry(node, index, kind, memoryMiB, instances); err != nil {
					return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
				}
			}
			s.cards = append(s.cards, c)
		}
	}
	if shape != "" {
		s.shape(shape)
	}
	return s, nil
}

// shape gives the cards the links, NUMA nodes and PCIe roots of a node of
// the shape.
func (s *Simulated) shape(shape string) {
	n := len(s.cards)
	for i := range s.cards {
		c := &s.cards[i]
		c.NUMANode, c.PCIeRoot = topology.Socket(shape, n, i), topology.PCIeRoot(shape, n, i)
		c.Links = make([]gpuinfo.LinkClass, n)
		for j := range c.Links {
			if j != i {
				c.Links[j] = topology.Link(shape, n, i, j)
			}
		}
	}
}

// parseMIGSpec reads "mig=PROFILE[@START]+..." or
// "mig-dynamic=PROFILE[@START]+...", what follows a model's colon: the
// instances, and whether the cards are dynamic.
func parseMIGSpec(spec string, present bool) ([]string, bool, error) {
	if !present {
		return nil, false, nil
	}
	list, ok := strings.CutPrefix(spec, "mig=")
	dynamic := false
	if !ok {
		list, dynamic = strings.CutPrefix(spec, "mig-dynamic=")
	}
	if !ok && !dynamic {
		return nil, false, fmt.Errorf("%q: want mig=PROFILE[@START]+... or mig-dynamic=PROFILE[@START]+..., e.g. mig=3g.20gb+1g.5gb", spec)
	}
	if list == "" {
		return nil, dynamic, nil
	}
	return strings.Split(list, "+"), dynamic, nil
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

// Cards returns a copy of the simulated cards, their MIG geometry included,
// which later slices created or destroyed do not change.
func (s *Simulated) Cards() ([]Card, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cards := slices.Clone(s.cards)
	for i := range cards {
		if m := cards[i].MIG; m != nil {
			c := *m
			c.Instances = slices.Clone(m.Instances)
			cards[i].MIG = &c
		}
	}
	return cards, nil
}

// CreateMIGSlice creates on card index an instance of the named profile at
// start, "MIG-sim-NODE-CARD-START", with the lowest MIG device index the
// card does not use, and returns its UUID.
func (s *Simulated) CreateMIGSlice(index int, profile string, start int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.migGeometry(index)
	if err == nil && s.migFailure != "" {
		err = errors.New(s.migFailure)
	}
	if err == nil {
		var in gpuinfo.MIGInstance
		if in, err = addInstance(m, s.node, index, profile, start); err == nil {
			return in.UUID, nil
		}
	}
	return "", fmt.Errorf("creating MIG slice %s@%d on card %d: %w", profile, start, index, err)
}

// DestroyMIGSlice removes card index's instance of the named profile at
// start, if it has one; it fails only when there is no card index.
func (s *Simulated) DestroyMIGSlice(index int, profile string, start int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < 0 || index >= len(s.cards) {
		return fmt.Errorf("destroying MIG slice %s@%d on card %d: no card %d", profile, start, index, index)
	}
	if m := s.cards[index].MIG; m != nil {
		m.Instances = slices.DeleteFunc(m.Instances, func(in gpuinfo.MIGInstance) bool { return in.Profile == profile && in.Start == start })
	}
	return nil
}

// migGeometry is the MIG geometry of card index, which must be in MIG mode;
// s.mu is held.
func (s *Simulated) migGeometry(index int) (*gpuinfo.MIG, error) {
	switch {
	case index < 0 || index >= len(s.cards):
		return nil, fmt.Errorf("no card %d", index)
	case s.cards[index].MIG == nil:
		return nil, fmt.Errorf("card %d is not in MIG mode", index)
	}
	return s.cards[index].MIG, nil
}

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
