package testutil

import (
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// This file recomputes what placed pods hold on each card from the
// contract's rules alone (docs/contract.md), written apart from the
// allocator and the ledger so that tests can check those against something
// that does not share their code.

// Use is memory and compute on one card.
type Use struct{ MemoryMiB, Cores int64 }

// RefContainer is a container as the contract's start rules see it.
type RefContainer struct {
	Name string
	// Init marks an init container; Sidecar a restartable one (init with
	// restartPolicy Always), which keeps running beside what starts after it.
	Init, Sidecar bool
}

// RefEntry is one card (or MIG slice) of a container's assignment.
type RefEntry struct {
	UUID      string `json:"uuid"`
	MemoryMiB int64  `json:"memoryMiB"`
	Cores     int64  `json:"cores"`
	MIG       *struct {
		UUID string `json:"uuid"`
	} `json:"mig"`
}

// device is what the entry holds part of: its MIG device's UUID for a
// slice, else the card's UUID.
func (e RefEntry) device() string {
	if e.MIG != nil {
		return e.MIG.UUID
	}
	return e.UUID
}

// Held returns what one pod holds on each card (by UUID; a MIG slice by its
// MIG device's UUID, as a card of its own): for each card, the
// most memory and the most compute its containers use there at the same
// time, at any phase of the pod's start. A regular init container runs with
// the sidecars started before it; the app containers run together with every
// sidecar. An entry with cores 100 holds the whole card (capacity gives each
// card's memory); entries for cards capacity does not know hold nothing.
func Held(containers []RefContainer, entries map[string][]RefEntry, capacity map[string]Use) map[string]Use {
	use := func(name string) map[string]Use {
		m := map[string]Use{}
		for _, e := range entries[name] {
			c, ok := capacity[e.device()]
			if !ok {
				continue
			}
			if e.Cores >= gpuinfo.FullCores {
				m[e.device()] = c
			} else {
				m[e.device()] = Use{e.MemoryMiB, e.Cores}
			}
		}
		return m
	}
	held := map[string]Use{}
	keep := func(phase map[string]Use) {
		for uuid, u := range phase {
			h := held[uuid]
			held[uuid] = Use{max(h.MemoryMiB, u.MemoryMiB), max(h.Cores, u.Cores)}
		}
	}
	sidecars := map[string]Use{}
	app := map[string]Use{}
	for _, c := range containers {
		switch {
		case c.Sidecar:
			sidecars = plus(sidecars, use(c.Name))
			keep(sidecars)
		case c.Init:
			keep(plus(sidecars, use(c.Name)))
		default:
			app = plus(app, use(c.Name))
		}
	}
	keep(plus(sidecars, app))
	return held
}

func plus(a, b map[string]Use) map[string]Use {
	out := map[string]Use{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		o := out[k]
		out[k] = Use{o.MemoryMiB + v.MemoryMiB, o.Cores + v.Cores}
	}
	return out
}

// HeldByPods sums Held over the pods that hold cards: bound, carrying an
// assignment, and not finished. It reads the assignment's JSON itself.
func HeldByPods(pods []v1.Pod, capacity map[string]Use) (map[string]Use, error) {
	total := map[string]Use{}
	for i := range pods {
		p := &pods[i]
		raw, ok := p.Annotations[gpuinfo.AssignmentAnnotation]
		if !ok || p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		var a struct {
			Containers map[string][]RefEntry `json:"containers"`
		}
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		var containers []RefContainer
		for _, c := range p.Spec.InitContainers {
			containers = append(containers, RefContainer{Name: c.Name, Init: true, Sidecar: c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways})
		}
		for _, c := range p.Spec.Containers {
			containers = append(containers, RefContainer{Name: c.Name})
		}
		total = plus(total, Held(containers, a.Containers, capacity))
	}
	return total, nil
}
