package gpushare

import (
	"sync"
	"sync/atomic"
)

// scoreMemo keeps, per node, the score that Filter's placement gave the pod
// of the current cycle, so that Score does not place the pod again on every
// feasible node. It serves the Binpack and Spread node policies, whose score
// is the node's usage after Filter's placement. A slot holds the cycle and
// the score in one word, so Filter (from many goroutines, one per node) and
// Score neither lock nor allocate once a node has its slot.
type scoreMemo struct {
	cycles atomic.Uint64
	slots  sync.Map // node name -> *atomic.Uint64: cycle<<scoreBits | score
}

// scoreBits is how many low bits of a slot hold the score (0-100).
const scoreBits = 16

// newCycle returns a number no earlier cycle had; 0 is never returned.
func (m *scoreMemo) newCycle() uint64 { return m.cycles.Add(1) }

// store records the node's score in the cycle.
func (m *scoreMemo) store(node string, cycle uint64, score int64) {
	v, ok := m.slots.Load(node)
	if !ok {
		v, _ = m.slots.LoadOrStore(node, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Store(cycle<<scoreBits | uint64(score))
}

// load returns the node's score if Filter stored one in the cycle.
func (m *scoreMemo) load(node string, cycle uint64) (int64, bool) {
	v, ok := m.slots.Load(node)
	if !ok {
		return 0, false
	}
	x := v.(*atomic.Uint64).Load()
	if x>>scoreBits != cycle {
		return 0, false
	}
	return int64(x & (1<<scoreBits - 1)), true
}

// forget drops a deleted node's slot.
func (m *scoreMemo) forget(node string) { m.slots.Delete(node) }
