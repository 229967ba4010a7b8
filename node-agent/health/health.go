// Package health decides whether a card may get new work, from the XID error
// events NVML delivers and from NVML's own view of the card. Unlike its
// peers, a card that turned unhealthy returns to service by itself once it
// has been quiet for a configurable period.
package health

import (
	"strconv"
	"sync"
	"time"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// applicationXIDs are errors an application causes (illegal address, MMU
// fault from user code, ...): they say nothing about the card.
var applicationXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// IsCritical reports whether an XID marks the card unhealthy.
func IsCritical(xid uint64) bool { return !applicationXIDs[xid] }

// Transition is a card changing health.
type Transition struct {
	UUID    string
	Healthy bool
	// Reason says why, e.g. "XID 79" or "quiet for 10m0s".
	Reason string
}

// Tracker remembers each card's last trouble. It is safe for concurrent use:
// events arrive on one goroutine, rescans on another.
type Tracker struct {
	quiet time.Duration
	now   func() time.Time
	mu    sync.Mutex
	cards map[string]*trouble
}

type trouble struct {
	last      time.Time
	reason    string
	announced bool
}

// NewTracker returns a tracker whose cards recover after quiet; now is the
// clock (time.Now in production).
func NewTracker(quiet time.Duration, now func() time.Time) *Tracker {
	return &Tracker{quiet: quiet, now: now, cards: map[string]*trouble{}}
}

// ObserveXID records an XID error on a card and reports whether it counts
// against the card (it is critical).
func (t *Tracker) ObserveXID(uuid string, xid uint64) bool {
	if !IsCritical(xid) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.troubleLocked(uuid, "XID "+strconv.FormatUint(xid, 10))
	return true
}

func (t *Tracker) troubleLocked(uuid, reason string) *trouble {
	tr := t.cards[uuid]
	if tr == nil {
		tr = &trouble{}
		t.cards[uuid] = tr
	}
	tr.last, tr.reason = t.now(), reason
	return tr
}

// Apply sets each card's Healthy flag: healthy when NVML reports it so and
// it has had no trouble for the quiet period; a card NVML reports unhealthy
// starts its quiet period again. It returns the cards whose health changed
// since the previous call.
func (t *Tracker) Apply(cards []discovery.Card) []Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var changes []Transition
	for i := range cards {
		c := &cards[i]
		tr := t.cards[c.UUID]
		if !c.Healthy {
			tr = t.troubleLocked(c.UUID, "NVML reports the card unhealthy")
		}
		if tr == nil {
			continue
		}
		if !c.Healthy || now.Sub(tr.last) < t.quiet {
			c.Healthy = false
			if !tr.announced {
				tr.announced = true
				changes = append(changes, Transition{UUID: c.UUID, Healthy: false, Reason: tr.reason})
			}
			continue
		}
		if tr.announced {
			changes = append(changes, Transition{UUID: c.UUID, Healthy: true, Reason: "quiet for " + t.quiet.String() + " since " + tr.reason})
		}
		delete(t.cards, c.UUID)
	}
	return changes
}
