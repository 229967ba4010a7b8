package ledger

import (
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ErrStaleInventory is returned by FitCurrent when the caller has seen a
// newer inventory annotation than the ledger.
var ErrStaleInventory = errors.New("GPU inventory changed")

// Fit places req on a node without recording anything: the answer to Filter
// and Score. err is the node's inventory problem (ErrNoInventory or a
// decoding error), in which case the outcome is empty.
func (l *Ledger) Fit(nodeName string, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy) (allocator.Outcome, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.fitLocked(nodeName, req, deltas, st)
}

// FitCurrent is Fit for a caller holding the scheduler's current node object:
// it returns ErrStaleInventory when the ledger has not recorded that object's
// inventory annotation yet, so the caller can record it and retry. With
// idle (the pod's, for its cycle), an idle node is answered as the last idle
// node of its kind was.
func (l *Ledger) FitCurrent(node *v1.Node, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy, idle *IdleFits) (allocator.Outcome, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n, current := l.lookup(node)
	if !current {
		return allocator.Outcome{}, ErrStaleInventory
	}
	if !n.usesIdleFits(idle, req, deltas, st) {
		return n.fit(req, deltas, st)
	}
	if out, ok := idle.get(n.kind, st.Policy); ok {
		return out, nil
	}
	out, err := n.fit(req, deltas, st)
	if err == nil {
		idle.put(n.kind, st.Policy, out)
	}
	return out, err
}

// current reports whether the entry n (nil when the ledger has none) records
// the inventory annotation of the node object. When the ledger has recorded
// the object's own resourceVersion, it does without looking the annotation
// up: Filter and Score ask this for every node and pod.
func (n *node) current(node *v1.Node) bool {
	if n != nil && n.seenRV != "" && n.seenRV == node.ResourceVersion {
		return true
	}
	raw, present := node.Annotations[gpuinfo.InventoryAnnotation]
	if n == nil {
		return !present
	}
	return n.hasReport == present && n.raw == raw
}

func (l *Ledger) fitLocked(nodeName string, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy) (allocator.Outcome, error) {
	return l.nodes[nodeName].fit(req, deltas, st)
}

// fit places req on the entry n (nil when the ledger has none), or returns
// why its GPUs cannot be used.
func (n *node) fit(req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy) (allocator.Outcome, error) {
	if err := n.unusable(); err != nil {
		return allocator.Outcome{}, err
	}
	return allocator.Place(n.cards, n.used, deltas, req, st, nil), nil
}

// unusable returns why the entry n (nil when the ledger has none) offers no
// GPUs, or nil.
func (n *node) unusable() error {
	if n == nil {
		return ErrNoInventory
	}
	return n.err
}

// FitWithoutGPU is Fit for a pod that asks for no GPUs: the outcome's
// fragmentation delta is what its CPU request does to the node.
func (l *Ledger) FitWithoutGPU(nodeName string, st allocator.Strategy) (allocator.Outcome, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[nodeName]
	if err := n.unusable(); err != nil {
		return allocator.Outcome{}, err
	}
	return allocator.PlaceWithoutGPU(n.cards, n.used, st), nil
}

// Reserve places the pod on the node, as adjusted by deltas (what nominated
// pods will hold there), and records it as assumed. It returns the
// assignment, or an error when the pod no longer fits.
func (l *Ledger) Reserve(uid types.UID, nodeName string, order []gpuinfo.NamedContainer, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy) (*gpuinfo.Assignment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removePodLocked(uid)
	n := l.nodes[nodeName]
	if n == nil || n.err != nil {
		return nil, fmt.Errorf("node %s: %w", nodeName, ErrNoInventory)
	}
	a := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{}}
	out := allocator.Place(n.cards, n.used, deltas, req, st, a)
	if !out.Fits {
		return nil, fmt.Errorf("%s", out.Failure.Message(req.Selector.String()))
	}
	a.Version = a.NeededVersion()
	l.addPodLocked(uid, &pod{node: nodeName, order: order, assignment: a, assumed: true})
	return a, nil
}

// ReservePlanned records the pod as assumed on exactly the cards of planned,
// an assignment chosen earlier in the same scheduling cycle (a pod group's
// dry run), when they still hold it with deltas applied. ok is false, and
// nothing is recorded, when they do not.
func (l *Ledger) ReservePlanned(uid types.UID, nodeName string, order []gpuinfo.NamedContainer, planned *gpuinfo.Assignment, deltas []allocator.Delta) (ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[nodeName]
	if n == nil || n.err != nil {
		return false
	}
	// Its own earlier record (a Reserve not undone) does not count against it.
	if !allocator.Holds(n.cards, n.usedWithout(l.pods[uid], nodeName), deltas, allocator.Charge(n.cards, order, planned)) {
		return false
	}
	l.removePodLocked(uid)
	l.addPodLocked(uid, &pod{node: nodeName, order: order, assignment: planned, assumed: true})
	return true
}

// Simulate places req on the node as adjusted by deltas and returns the
// deltas of that placement: what a nominated pod would hold. With usable,
// it places on the cards whose UUIDs usable accepts alone (the others
// count as full). ok is false when it does not fit.
func (l *Ledger) Simulate(nodeName string, order []gpuinfo.NamedContainer, req *gpuinfo.PodRequest, deltas []allocator.Delta, st allocator.Strategy, usable func(uuid string) bool) (added []allocator.Delta, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[nodeName]
	if n == nil || n.err != nil {
		return nil, false
	}
	if usable != nil {
		deltas = slices.Clone(deltas)
		for _, c := range n.cards {
			if !usable(c.UUID) {
				deltas = append(deltas, allocator.Delta{UUID: c.UUID, Usage: c.Capacity})
			}
		}
	}
	a := &gpuinfo.Assignment{Version: gpuinfo.AssignmentVersion1, Containers: map[string][]gpuinfo.CardAssignment{}}
	if out := allocator.Place(n.cards, n.used, deltas, req, st, a); !out.Fits {
		return nil, false
	}
	return toDeltas(n.cards, allocator.Charge(n.cards, order, a), 1), true
}

// PodDeltas returns what a recorded pod holds, as deltas with the given sign
// (+1 to add, -1 to remove), or nil when the pod is not recorded on nodeName.
func (l *Ledger) PodDeltas(uid types.UID, nodeName string, sign int64) []allocator.Delta {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p := l.pods[uid]
	n := l.nodes[nodeName]
	if p == nil || n == nil || p.node != nodeName || len(p.charge) != len(n.cards) {
		return nil
	}
	return toDeltas(n.cards, p.charge, sign)
}

func toDeltas(cards []allocator.Card, charge []allocator.Usage, sign int64) []allocator.Delta {
	var d []allocator.Delta
	for i, u := range charge {
		if u != (allocator.Usage{}) {
			d = append(d, allocator.Delta{UUID: cards[i].UUID, Usage: allocator.Usage{MemoryMiB: sign * u.MemoryMiB, Cores: sign * u.Cores}})
		}
	}
	return d
}

// CardsHealthy reports whether every card of the assignment is still reported,
// under the same UUID, and healthy on the node.
func (l *Ledger) CardsHealthy(nodeName string, a *gpuinfo.Assignment) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[nodeName]
	if n == nil || n.err != nil {
		return fmt.Errorf("node %s no longer reports a valid GPU inventory", nodeName)
	}
	for name, entries := range a.Containers {
		for _, e := range entries {
			i := -1
			for j := range n.cards {
				if n.cards[j].UUID == e.Key() {
					i = j
				}
			}
			if i < 0 || n.cards[i].Index != e.Index {
				return fmt.Errorf("GPU %d (%s) chosen for container %q is no longer reported by node %s", e.Index, e.UUID, name, nodeName)
			}
			if !n.cards[i].Healthy {
				return fmt.Errorf("GPU %d (%s) chosen for container %q became unhealthy on node %s", e.Index, e.UUID, name, nodeName)
			}
			if n.cards[i].MIG {
				return fmt.Errorf("GPU %d (%s) chosen for container %q is in MIG mode now on node %s", e.Index, e.UUID, name, nodeName)
			}
		}
	}
	return nil
}

// usedWithout is the node's usage without p's charge when p is recorded on
// it (nodeName), else its usage.
func (n *node) usedWithout(p *pod, nodeName string) []allocator.Usage {
	if p == nil || p.node != nodeName || len(p.charge) != len(n.cards) {
		return n.used
	}
	used := make([]allocator.Usage, len(n.used))
	for i := range used {
		used[i] = allocator.Usage{MemoryMiB: n.used[i].MemoryMiB - p.charge[i].MemoryMiB, Cores: n.used[i].Cores - p.charge[i].Cores}
	}
	return used
}
