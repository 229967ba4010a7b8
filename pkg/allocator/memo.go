package allocator

import (
	"slices"
	"sync"
)

// FragmentMemo keeps one node's last fragmentation measure, so that Place
// and PlaceWithoutGPU do not measure a node again while nothing they
// measure has changed: kube-scheduler scores every node for every pod, and
// between two pods most nodes do not change. Give each node its own memo
// (Strategy.Memo); a memo in use by another goroutine is passed over, not
// waited for.
type FragmentMemo struct {
	mu       sync.Mutex
	workload *Workload
	cpuFree  int64
	cards    []memoCard
	free     []Usage
	frag     fragment
}

// memoCard is what the measure reads of a card.
type memoCard struct {
	model    string
	capacity Usage
	shares   bool
}

// same reports whether the memo holds the measure of these inputs.
func (m *FragmentMemo) same(w *Workload, cards []Card, free []Usage, cpuFree int64) bool {
	if m.workload != w || m.cpuFree != cpuFree || len(m.cards) != len(cards) || !slices.Equal(m.free, free) {
		return false
	}
	for i := range cards {
		if m.cards[i] != (memoCard{cards[i].ModelLower, cards[i].Capacity, cards[i].TakesShares()}) {
			return false
		}
	}
	return true
}

// measure sets f to the node's fragment as f.measure would, from the memo
// when it holds these inputs, recording them otherwise. A nil memo
// measures.
func (m *FragmentMemo) measure(f *fragment, w *Workload, cards []Card, free []Usage, cpuFree int64) {
	if m == nil || !m.mu.TryLock() {
		f.measure(w, cards, free, cpuFree)
		return
	}
	defer m.mu.Unlock()
	if m.same(w, cards, free, cpuFree) {
		f.copyFrom(&m.frag)
		return
	}
	f.measure(w, cards, free, cpuFree)
	m.workload, m.cpuFree = w, cpuFree
	m.free = append(m.free[:0], free...)
	m.cards = m.cards[:0]
	for i := range cards {
		m.cards = append(m.cards, memoCard{cards[i].ModelLower, cards[i].Capacity, cards[i].TakesShares()})
	}
	m.frag.copyFrom(f)
}

// copyFrom makes f a copy of src that shares no memory with it.
func (f *fragment) copyFrom(src *fragment) {
	fitting := f.fitting
	*f = *src
	f.fitting = append(fitting[:0], src.fitting...)
}
