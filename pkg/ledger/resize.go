package ledger

import (
	"errors"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ErrNoRoom is the refusal of a resize the pod's cards have no room for.
var ErrNoRoom = errors.New("no room on the pod's cards")

// Resize records for a pod bound on a node a new share on the cards it
// holds — resized, the same cards with other shares — ahead of its
// assignment annotation, when the cards hold it with deltas (what
// nominated pods will take) applied, its own current charge aside. The
// error wraps ErrNoRoom, naming a card short of room, when they do not.
// Until AddPod brings an annotation with resized's shares, or ForgetResize
// runs, the ledger charges resized whatever older annotations say: a grow
// holds its room from the moment it is decided, and no placement takes it
// while the annotation is written.
func (l *Ledger) Resize(uid types.UID, resized *gpuinfo.Assignment, deltas []allocator.Delta) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[uid]
	if p == nil || p.assumed {
		return fmt.Errorf("the pod is not recorded as bound")
	}
	n := l.nodes[p.node]
	if n == nil || n.err != nil {
		return fmt.Errorf("node %s: %w", p.node, ErrNoInventory)
	}
	used := n.usedWithout(p, p.node)
	charge := allocator.Charge(n.cards, p.order, resized)
	if !allocator.Holds(n.cards, used, deltas, charge) {
		return shortOfRoom(n.cards, used, deltas, charge)
	}
	seen := p.assignment
	if p.ahead != nil {
		seen = p.seen
	}
	l.removePodLocked(uid)
	l.addPodLocked(uid, &pod{node: p.node, order: p.order, assignment: resized, ahead: resized, seen: seen})
	return nil
}

// ForgetResize drops a share Resize recorded ahead of the pod's
// annotation, which its annotation never came to say (the resize failed):
// the pod is charged what its newest annotation says.
func (l *Ledger) ForgetResize(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[uid]
	if p == nil || p.ahead == nil {
		return
	}
	l.removePodLocked(uid)
	l.addPodLocked(uid, &pod{node: p.node, order: p.order, assignment: p.seen})
}

// withAhead is p, recorded from annotation a, keeping the share old
// recorded ahead of the annotation while a does not say it yet.
func withAhead(p, old *pod, a *gpuinfo.Assignment) *pod {
	if old == nil || old.ahead == nil || p.assumed || old.node != p.node || reflect.DeepEqual(old.ahead.Containers, a.Containers) {
		return p
	}
	p.assignment, p.ahead, p.seen = old.ahead, old.ahead, a
	return p
}

// shortOfRoom names the first card charge does not fit, for the refusal.
func shortOfRoom(cards []allocator.Card, used []allocator.Usage, deltas []allocator.Delta, charge []allocator.Usage) error {
	for i := range cards {
		if charge[i] == (allocator.Usage{}) {
			continue
		}
		free := allocator.Usage{MemoryMiB: cards[i].Capacity.MemoryMiB - used[i].MemoryMiB, Cores: cards[i].Capacity.Cores - used[i].Cores}
		for _, d := range deltas {
			if d.UUID == cards[i].UUID {
				free.MemoryMiB, free.Cores = free.MemoryMiB-d.Usage.MemoryMiB, free.Cores-d.Usage.Cores
			}
		}
		if charge[i].MemoryMiB > free.MemoryMiB || charge[i].Cores > free.Cores {
			return fmt.Errorf("%w: card %d has %d MiB and %d%% compute for the pod (beside the others' shares), the new share needs %d MiB and %d%%",
				ErrNoRoom, cards[i].Index, max(free.MemoryMiB, 0), max(free.Cores, 0), charge[i].MemoryMiB, charge[i].Cores)
		}
	}
	return ErrNoRoom
}
