package gpushare

import (
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
)

// nodeRecords keeps what the plugin knows of each node beside the ledger: its
// agent's heartbeat, the score Filter's placement gave the pod of the current
// cycle, and the snapshot generation at which the ledger was last found to
// hold no pod the snapshot lacks. One record per node, so that Filter and
// Score look a node up once per pod; its fields are atomic, so neither locks
// nor allocates once the record exists. Records are made by the node and
// Lease handlers, never by Filter or Score.
type nodeRecords struct {
	mu     sync.RWMutex
	byName map[string]*nodeRecord
	// byObject files each record under the newest node object the node
	// handler has seen — the informer's, which the scheduler's snapshot
	// holds too — so that Filter and Score, which look a node up on every
	// node for every pod, hash a pointer instead of hashing and comparing
	// the name (about half the cost, docs/performance.md). A snapshot older
	// or newer than the handler misses it and finds the record by name.
	byObject map[*v1.Node]*nodeRecord
	// cycles numbers the scheduling cycles for the score slots.
	cycles atomic.Uint64
}

// nodeRecord is one node's record.
type nodeRecord struct {
	// renewed is when the scheduler saw the agent's Lease last renewed,
	// Unix nanoseconds on the scheduler's clock (so that a node's clock
	// running ahead or behind does not move the cut-off); 0 while the node
	// has no Lease.
	renewed atomic.Int64
	// leaseRenewTime is the Lease's own renewTime as last seen (the agent's
	// clock): a change is a renewal.
	leaseRenewTime atomic.Int64
	// notReady is the agent's reason for not enforcing assignments, nil
	// while it gives none.
	notReady atomic.Pointer[string]
	// score holds cycle<<scoreBits | score: Filter's score for the pod of
	// that cycle, kept for Score under the Binpack and Spread policies.
	score atomic.Uint64
	// consistentAt is 1 + the snapshot generation at which the ledger was
	// found consistent with the node's pods (mayBeStale); 0 before.
	consistentAt atomic.Int64
	// object is the node object byObject holds the record under (nil for
	// none); guarded by nodeRecords.mu.
	object *v1.Node
}

// scoreBits is how many low bits of a score slot hold the score (0-100).
const scoreBits = 16

// get returns the node's record, or nil.
func (r *nodeRecords) get(node string) *nodeRecord {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byName[node]
}

// lookup returns the record of the node object, or nil: by the object
// itself where the node handler has filed the record under it, else by name.
func (r *nodeRecords) lookup(node *v1.Node) *nodeRecord {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rec := r.byObject[node]; rec != nil {
		return rec
	}
	return r.byName[node.Name]
}

// ensure returns the node's record, making it if there is none.
func (r *nodeRecords) ensure(node string) *nodeRecord {
	if rec := r.get(node); rec != nil {
		return rec
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ensureLocked(node)
}

// track makes the node's record if there is none and files it under the
// node object, in place of the object it was filed under before.
func (r *nodeRecords) track(node *v1.Node) {
	r.mu.RLock()
	rec := r.byObject[node]
	r.mu.RUnlock()
	if rec != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec = r.ensureLocked(node.Name)
	if rec.object == node {
		return
	}
	r.unfileLocked(rec)
	if r.byObject == nil {
		r.byObject = map[*v1.Node]*nodeRecord{}
	}
	r.byObject[node], rec.object = rec, node
}

// unfileLocked takes the record out of byObject.
func (r *nodeRecords) unfileLocked(rec *nodeRecord) {
	if rec.object != nil {
		delete(r.byObject, rec.object)
		rec.object = nil
	}
}

func (r *nodeRecords) ensureLocked(node string) *nodeRecord {
	if r.byName == nil {
		r.byName = map[string]*nodeRecord{}
	}
	rec := r.byName[node]
	if rec == nil {
		rec = &nodeRecord{}
		r.byName[node] = rec
	}
	return rec
}

// nodeDeleted drops what the record held for the node object: the score
// slot and the consistency mark; the record goes when no Lease remains.
func (r *nodeRecords) nodeDeleted(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.byName[node]; rec != nil {
		r.unfileLocked(rec)
		if rec.renewed.Load() == 0 {
			delete(r.byName, node)
			return
		}
		rec.score.Store(0)
		rec.consistentAt.Store(0)
	}
}

// leaseDeleted drops the node's record: without a Lease it has no heartbeat,
// and the score slot and consistency mark are caches the next cycle refills.
func (r *nodeRecords) leaseDeleted(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.byName[node]; rec != nil {
		r.unfileLocked(rec)
		delete(r.byName, node)
	}
}

// heartbeat is one node's agent as a node record shows it.
type heartbeat struct {
	node     string
	renewed  time.Time
	notReady *string
}

// heartbeats lists the nodes whose agents hold a Lease.
func (r *nodeRecords) heartbeats() []heartbeat {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]heartbeat, 0, len(r.byName))
	for node, rec := range r.byName {
		if renewed := rec.renewed.Load(); renewed != 0 {
			out = append(out, heartbeat{node: node, renewed: time.Unix(0, renewed), notReady: rec.notReady.Load()})
		}
	}
	return out
}

// newCycle returns a cycle number no earlier cycle had; 0 is never returned.
func (r *nodeRecords) newCycle() uint64 { return r.cycles.Add(1) }

// silentSince reports whether the agent has not renewed its Lease since
// cutoff (Unix nanoseconds); a node without a Lease is never silent.
func (rec *nodeRecord) silentSince(cutoff int64) bool {
	renewed := rec.renewed.Load()
	return renewed != 0 && renewed < cutoff
}

// storeScore records the node's score in the cycle.
func (rec *nodeRecord) storeScore(cycle uint64, score int64) {
	rec.score.Store(cycle<<scoreBits | uint64(score))
}

// loadScore returns the node's score if Filter stored one in the cycle.
func (rec *nodeRecord) loadScore(cycle uint64) (int64, bool) {
	x := rec.score.Load()
	if x>>scoreBits != cycle {
		return 0, false
	}
	return int64(x & (1<<scoreBits - 1)), true
}
