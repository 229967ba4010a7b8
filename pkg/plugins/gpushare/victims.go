package gpushare

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// victimBook records, for each pod the scheduler evicts, the pods it evicts
// it for, and for each of those the cards its victims hold or held: what
// its nomination claims (the preemption plugin writes it: Preemption). All
// profiles of one scheduler share one book, as they share the feed. It
// lives in memory only: after a restart it is empty, and the victims
// evicted before count for every preemptor of higher priority on their node
// (evictedFor) and claim no cards.
type victimBook struct {
	mu sync.Mutex
	// preemptors maps a victim's UID to the UIDs of the pods it was evicted
	// for (a pod group's members, or one pod; a victim already terminating
	// can be chosen again by another preemptor).
	preemptors map[types.UID]sets.Set[types.UID]
	// claims maps a preemptor's UID to the cards its victims hold or held.
	claims map[types.UID]claim
}

// claim is the cards a preemptor's victims hold or held on one node, by
// victim: kept after the victims are gone, until the preemptor is bound or
// deleted, or preempts on another node.
type claim struct {
	node  string
	cards map[types.UID][]string
}

var (
	victimBooksMu sync.Mutex
	victimBooks   = map[informers.SharedInformerFactory]*victimBook{}
)

// victimBookFor returns the book of the informer factory, creating it on
// first use; it is dropped when ctx (the scheduler's) ends.
func victimBookFor(ctx context.Context, factory informers.SharedInformerFactory) *victimBook {
	victimBooksMu.Lock()
	defer victimBooksMu.Unlock()
	if b := victimBooks[factory]; b != nil {
		return b
	}
	b := newVictimBook()
	victimBooks[factory] = b
	go func() {
		<-ctx.Done()
		victimBooksMu.Lock()
		delete(victimBooks, factory)
		victimBooksMu.Unlock()
	}()
	return b
}

func newVictimBook() *victimBook {
	return &victimBook{preemptors: map[types.UID]sets.Set[types.UID]{}, claims: map[types.UID]claim{}}
}

// record notes that victim is evicted for the preemptor pods, which claim
// its cards on its node.
func (b *victimBook) record(victim *v1.Pod, preemptors []types.UID) {
	cards := assignedCards(victim)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.preemptors[victim.UID] == nil {
		b.preemptors[victim.UID] = sets.New[types.UID]()
	}
	b.preemptors[victim.UID].Insert(preemptors...)
	for _, p := range preemptors {
		c := b.claims[p]
		if c.cards == nil || c.node != victim.Spec.NodeName {
			c = claim{node: victim.Spec.NodeName, cards: map[types.UID][]string{}}
			b.claims[p] = c
		}
		c.cards[victim.UID] = cards
	}
}

// forget takes back a record: the eviction failed, or took the victim out
// of a waiting state without deleting it.
func (b *victimBook) forget(victim types.UID, preemptors []types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if set := b.preemptors[victim]; set != nil {
		set.Delete(preemptors...)
		if set.Len() == 0 {
			delete(b.preemptors, victim)
		}
	}
	for _, p := range preemptors {
		delete(b.claims[p].cards, victim)
	}
}

// drop removes a victim that is gone; the cards it held stay claimed.
func (b *victimBook) drop(victim types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.preemptors, victim)
}

// release removes a preemptor's claim: it is bound or gone.
func (b *victimBook) release(preemptor types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.claims, preemptor)
}

// claimed returns the UUIDs of the cards preemptor's victims on node hold
// or held, or nil when it claims none there.
func (b *victimBook) claimed(preemptor types.UID, node string) sets.Set[string] {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.claims[preemptor]
	if c.node != node || len(c.cards) == 0 {
		return nil
	}
	uuids := sets.New[string]()
	for _, cards := range c.cards {
		uuids.Insert(cards...)
	}
	return uuids
}

// claimNode is the node preemptor's victims were evicted from, "" when the
// book records none for it.
func (b *victimBook) claimNode(preemptor types.UID) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.claims[preemptor].node
}

// assignedCards returns the UUIDs of the cards a bound pod's assignment
// names; none when it has no valid one.
func assignedCards(pod *v1.Pod) []string {
	a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		return nil
	}
	var uuids []string
	for _, cards := range a.Containers {
		for _, c := range cards {
			uuids = append(uuids, c.Key())
		}
	}
	return uuids
}

// evictedFor reports whether victim is being terminated by the scheduler's
// preemption (its DisruptionTarget condition, which only the scheduler sets
// on a pod it evicts) for preemptor: the pods whose cards a preemptor waits
// for on its node. When the book knows the victim, only the preemptors it
// was chosen for; when it does not (evicted before this scheduler started),
// every preemptor of higher priority, as upstream's eligibility rule has it.
// A pod its owner deleted, however long its grace period, is no victim.
func (b *victimBook) evictedFor(victim, preemptor *v1.Pod) bool {
	if !preemption.PodTerminatingByPreemption(victim) {
		return false
	}
	b.mu.Lock()
	set, known := b.preemptors[victim.UID]
	chosen := set.Has(preemptor.UID)
	b.mu.Unlock()
	if known {
		return chosen
	}
	return corev1helpers.PodPriority(victim) < corev1helpers.PodPriority(preemptor)
}
