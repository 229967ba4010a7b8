// Package ledger keeps Tessera's per-card account of GPU memory and compute
// for every node: capacity from the nodes' inventories, usage from the pods
// placed on them (bound pods from their assignment annotations, assumed pods
// from the scheduler's Reserve). It is safe for concurrent use: placement
// queries take a read lock and do not allocate.
package ledger

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ErrNoInventory is the state of a node that reports no GPU inventory.
var ErrNoInventory = errors.New("GPU inventory missing")

// Ledger is the cluster's per-card account.
type Ledger struct {
	mu    sync.RWMutex
	nodes map[string]*node
	pods  map[types.UID]*pod
	// byFreeCards counts the nodes with a valid inventory by how many of
	// their usable cards are entirely free (NodesWithFreeCards).
	byFreeCards [gpuinfo.MaxCardsPerNode + 1]int
	// inventories counts changes to the recorded inventories
	// (UsableCardsByModel).
	inventories uint64
	// kinds numbers the kinds of node seen (kindOf), from 1.
	kinds map[string]uint32
	// byObject files each entry under the newest node object whose
	// inventory it recorded (SetNode): Filter, holding the scheduler's node
	// object — the informer's, the same pointer — finds the entry and knows
	// it current by a pointer hash, without hashing the name or comparing
	// versions (lookup).
	byObject map[*v1.Node]*node
}

type node struct {
	raw       string
	version   uint64
	cards     []allocator.Card
	used      []allocator.Usage
	err       error
	pods      map[types.UID]struct{}
	hasReport bool
	// room summarises what the usable cards have free (summarize).
	room room
	// countedAt is the entry of Ledger.byFreeCards that counts the node, or
	// -1 while its inventory is missing or invalid.
	countedAt int
	// seenRV is the resourceVersion of the newest node object whose
	// inventory annotation the ledger has recorded (or found unchanged).
	seenRV string
	// object is the node object byObject files the entry under, or nil.
	object *v1.Node
	// kind numbers the node's cards as a placement sees them (kindOf); 0
	// while it has none.
	kind uint32
	// idle is set while nothing is charged on any of its cards.
	idle bool
}

type pod struct {
	node       string
	order      []gpuinfo.NamedContainer
	assignment *gpuinfo.Assignment
	assumed    bool
	charge     []allocator.Usage // parallel to the node's cards when charged
	// ahead, when set, is a share Resize recorded before the pod's
	// annotation says it (assignment is ahead then), and seen the newest
	// annotation.
	ahead, seen *gpuinfo.Assignment
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{nodes: map[string]*node{}, pods: map[types.UID]*pod{}}
}

func (l *Ledger) nodeLocked(name string) *node {
	n := l.nodes[name]
	if n == nil {
		n = &node{err: ErrNoInventory, pods: map[types.UID]struct{}{}, countedAt: -1}
		l.nodes[name] = n
	}
	return n
}

// SetNode records a node object's inventory annotation (or that it has
// none) as of the object's resourceVersion; an annotation from an older
// version than the one recorded is ignored, so updates that arrive out of
// order never roll the ledger back. It returns whether the stored state
// changed and the decoding error, if any; a node with an invalid inventory
// offers no GPUs. Usage is recomputed from the node's pods, so a shrinking
// inventory frees nothing twice and never leaves a charge on a card that is
// gone. Once the ledger holds the object's inventory it files the entry
// under the object, for lookup.
func (l *Ledger) SetNode(obj *v1.Node) (changed bool, err error) {
	raw, present := obj.Annotations[gpuinfo.InventoryAnnotation]
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(obj.Name)
	changed, err = l.setInventoryLocked(n, obj.ResourceVersion, raw, present)
	if n.object != obj && n.seenRV != "" && n.seenRV == obj.ResourceVersion {
		l.unfileLocked(n)
		if l.byObject == nil {
			l.byObject = map[*v1.Node]*node{}
		}
		l.byObject[obj], n.object = n, obj
	}
	return changed, err
}

func (l *Ledger) setInventoryLocked(n *node, resourceVersion, raw string, present bool) (changed bool, err error) {
	version, _ := strconv.ParseUint(resourceVersion, 10, 64)
	if version != 0 && version < n.version {
		return false, n.errIfInvalid()
	}
	if n.object != nil && n.object.ResourceVersion != resourceVersion {
		l.unfileLocked(n)
	}
	if version != 0 {
		n.seenRV = resourceVersion
	}
	if n.hasReport == present && n.raw == raw {
		n.version = max(version, n.version)
		return false, n.errIfInvalid()
	}
	n.raw, n.hasReport, n.version = raw, present, max(version, n.version)
	n.cards, n.err, n.kind = nil, ErrNoInventory, 0
	l.inventories++
	if present {
		inv, derr := gpuinfo.DecodeInventory(raw)
		if derr != nil {
			n.err = derr
		} else {
			n.cards, n.err = allocator.NewCards(inv), nil
			n.kind = l.kindOf(n.cards)
		}
	}
	l.rechargeLocked(n)
	return true, n.errIfInvalid()
}

// unfileLocked takes the entry out of byObject.
func (l *Ledger) unfileLocked(n *node) {
	if n.object != nil {
		delete(l.byObject, n.object)
		n.object = nil
	}
}

// lookup returns the entry (nil when the ledger has none) for the
// scheduler's node object and whether it records that object's inventory:
// by the object itself where it is filed, else by name and comparison.
func (l *Ledger) lookup(node *v1.Node) (n *node, current bool) {
	if n := l.byObject[node]; n != nil {
		return n, true
	}
	n = l.nodes[node.Name]
	return n, n.current(node)
}

func (n *node) errIfInvalid() error {
	if n.err == ErrNoInventory {
		return nil
	}
	return n.err
}

// DeleteNode forgets a node's inventory. Pods still recorded on it keep their
// entries until they are removed.
func (l *Ledger) DeleteNode(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[name]
	if n == nil {
		return
	}
	l.inventories++
	l.unfileLocked(n)
	if len(n.pods) == 0 {
		l.uncount(n)
		delete(l.nodes, name)
		return
	}
	n.raw, n.hasReport, n.cards, n.err = "", false, nil, ErrNoInventory
	l.rechargeLocked(n)
}

// rechargeLocked recomputes a node's usage from its pods.
func (l *Ledger) rechargeLocked(n *node) {
	n.used = make([]allocator.Usage, len(n.cards))
	for uid := range n.pods {
		p := l.pods[uid]
		p.charge = allocator.Charge(n.cards, p.order, p.assignment)
		addUsage(n.used, p.charge, 1)
	}
	l.summarize(n)
}

// kindOf numbers the kind of node that has these cards: their models,
// capacities, health, MIG mode and slices in index order; 0 (no kind) for a
// node with a dynamic card — all that a placement
// without UUID selectors sees of an idle node.
func (l *Ledger) kindOf(cards []allocator.Card) uint32 {
	if slices.ContainsFunc(cards, func(c allocator.Card) bool { return c.MIGDynamic }) {
		// A dynamic card's layout changes with its pods: numbering every
		// layout seen would grow the table without bound.
		return 0
	}
	var b strings.Builder
	for _, c := range cards {
		fmt.Fprintf(&b, "%s/%d/%d/%t/%t", c.ModelLower, c.Capacity.MemoryMiB, c.Capacity.Cores, c.Healthy, c.MIG)
		if c.Slice != nil {
			b.WriteString("/" + c.Slice.Name())
		}
		b.WriteByte(';')
	}
	if l.kinds == nil {
		l.kinds = map[string]uint32{}
	}
	k, ok := l.kinds[b.String()]
	if !ok {
		k = uint32(len(l.kinds) + 1)
		l.kinds[b.String()] = k
	}
	return k
}

// summarize recomputes the node's room and recounts it in byFreeCards.
func (l *Ledger) summarize(n *node) {
	l.uncount(n)
	n.summarize()
	n.idle = !slices.ContainsFunc(n.used, func(u allocator.Usage) bool { return u != allocator.Usage{} })
	if n.err == nil {
		n.countedAt = min(n.room.freeCards, gpuinfo.MaxCardsPerNode)
		l.byFreeCards[n.countedAt]++
	}
}

// uncount takes the node out of byFreeCards.
func (l *Ledger) uncount(n *node) {
	if n.countedAt >= 0 {
		l.byFreeCards[n.countedAt]--
		n.countedAt = -1
	}
}

func addUsage(dst, src []allocator.Usage, sign int64) {
	for i := range src {
		dst[i].MemoryMiB += sign * src[i].MemoryMiB
		dst[i].Cores += sign * src[i].Cores
	}
}

// AddPod records a pod's cards on a node: a bound pod from its assignment
// annotation, or an assumed one from Reserve. It replaces any earlier record
// of the same pod.
// A share Resize recorded ahead of the annotation stands until a says it.
func (l *Ledger) AddPod(uid types.UID, nodeName string, order []gpuinfo.NamedContainer, a *gpuinfo.Assignment, assumed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := withAhead(&pod{node: nodeName, order: order, assignment: a, assumed: assumed}, l.pods[uid], a)
	l.removePodLocked(uid)
	l.addPodLocked(uid, p)
}

func (l *Ledger) addPodLocked(uid types.UID, p *pod) {
	n := l.nodeLocked(p.node)
	p.charge = allocator.Charge(n.cards, p.order, p.assignment)
	addUsage(n.used, p.charge, 1)
	l.summarize(n)
	n.pods[uid] = struct{}{}
	l.pods[uid] = p
}

// RemovePod frees a pod's cards. It is a no-op for an unknown pod.
func (l *Ledger) RemovePod(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removePodLocked(uid)
}

// ForgetAssumed frees the cards of a pod assumed on nodeName, as Unreserve
// must; a pod already confirmed bound, or recorded on another node, is kept.
func (l *Ledger) ForgetAssumed(uid types.UID, nodeName string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[uid]; p != nil && p.assumed && p.node == nodeName {
		l.removePodLocked(uid)
	}
}

func (l *Ledger) removePodLocked(uid types.UID) {
	p := l.pods[uid]
	if p == nil {
		return
	}
	delete(l.pods, uid)
	n := l.nodes[p.node]
	if n == nil {
		return
	}
	if len(p.charge) == len(n.used) {
		addUsage(n.used, p.charge, -1)
		l.summarize(n)
	}
	delete(n.pods, uid)
	if len(n.pods) == 0 && !n.hasReport {
		l.uncount(n)
		delete(l.nodes, p.node)
	}
}

// BoundPods returns the pods recorded as bound on a node (not the assumed
// ones), for checking them against the API.
func (l *Ledger) BoundPods(nodeName string) []types.UID {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[nodeName]
	if n == nil {
		return nil
	}
	var uids []types.UID
	for uid := range n.pods {
		if !l.pods[uid].assumed {
			uids = append(uids, uid)
		}
	}
	return uids
}

// BoundCount is the number of BoundPods, without listing them.
func (l *Ledger) BoundCount(nodeName string) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[nodeName]
	if n == nil {
		return 0
	}
	count := 0
	for uid := range n.pods {
		if !l.pods[uid].assumed {
			count++
		}
	}
	return count
}

// Holds reports whether the ledger has cards recorded for the pod.
func (l *Ledger) Holds(uid types.UID) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.pods[uid] != nil
}
