package discovery

import (
	"fmt"
	"strconv"
	"strings"
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
// as "<name>-<N>GB" with N GiB of memory. UUIDs derive from the node name, so
// they are stable across restarts.
type Simulated struct {
	cards []Card
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
		model, memoryMiB, err := parseKind(kind)
		if err != nil {
			return nil, fmt.Errorf("simulated GPUs %q: %w", part, err)
		}
		for i := 0; i < count; i++ {
			index := len(s.cards)
			s.cards = append(s.cards, Card{
				Index: index, UUID: fmt.Sprintf("GPU-sim-%s-%d", node, index), Model: model,
				MemoryMiB: memoryMiB, NUMANode: -1, Healthy: true,
			})
		}
	}
	return s, nil
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
