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
)

// victimBook records, for each pod the scheduler evicts, the pods it evicts
// it for (the preemption plugin writes it: Preemption). All profiles of one
// scheduler share one book, as they share the feed. It lives in memory only:
// after a restart it is empty, and the victims evicted before count for
// every preemptor of higher priority on their node (evictedFor).
type victimBook struct {
	mu sync.Mutex
	// preemptors maps a victim's UID to the UIDs of the pods it was evicted
	// for (a pod group's members, or one pod; a victim already terminating
	// can be chosen again by another preemptor).
	preemptors map[types.UID]sets.Set[types.UID]
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
	b := &victimBook{preemptors: map[types.UID]sets.Set[types.UID]{}}
	victimBooks[factory] = b
	go func() {
		<-ctx.Done()
		victimBooksMu.Lock()
		delete(victimBooks, factory)
		victimBooksMu.Unlock()
	}()
	return b
}

// record notes that victim is evicted for the preemptor pods.
func (b *victimBook) record(victim types.UID, preemptors []types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.preemptors[victim] == nil {
		b.preemptors[victim] = sets.New[types.UID]()
	}
	b.preemptors[victim].Insert(preemptors...)
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
}

// drop removes a victim that is gone.
func (b *victimBook) drop(victim types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.preemptors, victim)
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
