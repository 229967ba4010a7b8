package health

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

func TestIsCritical(t *testing.T) {
	for xid, want := range map[uint64]bool{13: false, 31: false, 43: false, 45: false, 68: false, 109: false, 48: true, 79: true, 94: true, 95: true} {
		if got := IsCritical(xid); got != want {
			t.Errorf("IsCritical(%d) = %v, want %v", xid, got, want)
		}
	}
}

func TestTrackerMarksAndRecovers(t *testing.T) {
	clock := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(10*time.Minute, func() time.Time { return clock })
	scan := func(nvmlHealthy ...bool) ([]bool, []Transition) {
		cards := make([]discovery.Card, len(nvmlHealthy))
		for i, h := range nvmlHealthy {
			cards[i] = discovery.Card{UUID: string(rune('a' + i)), Healthy: h}
		}
		changes := tr.Apply(cards)
		var healthy []bool
		for _, c := range cards {
			healthy = append(healthy, c.Healthy)
		}
		return healthy, changes
	}
	check := func(step string, gotHealthy []bool, gotChanges []Transition, wantHealthy []bool, wantChanges []Transition) {
		t.Helper()
		if diff := cmp.Diff(wantHealthy, gotHealthy); diff != "" {
			t.Errorf("%s: health (-want,+got):\n%s", step, diff)
		}
		if diff := cmp.Diff(wantChanges, gotChanges); diff != "" {
			t.Errorf("%s: transitions (-want,+got):\n%s", step, diff)
		}
	}

	h, c := scan(true, true)
	check("all quiet", h, c, []bool{true, true}, nil)

	if tr.ObserveXID("a", 13) {
		t.Error("an application XID counted against the card")
	}
	if !tr.ObserveXID("b", 79) {
		t.Error("XID 79 (fallen off the bus) did not count")
	}
	h, c = scan(true, true)
	check("after XIDs", h, c, []bool{true, false}, []Transition{{UUID: "b", Healthy: false, Reason: "XID 79"}})

	clock = clock.Add(5 * time.Minute)
	h, c = scan(true, true)
	check("still within the quiet period", h, c, []bool{true, false}, nil)

	clock = clock.Add(4 * time.Minute)
	h, c = scan(true, false)
	check("NVML reports it bad again", h, c, []bool{true, false}, nil)

	clock = clock.Add(9 * time.Minute)
	h, c = scan(true, true)
	check("quiet period restarted by NVML", h, c, []bool{true, false}, nil)

	clock = clock.Add(2 * time.Minute)
	h, c = scan(true, true)
	check("recovered", h, c, []bool{true, true}, []Transition{{UUID: "b", Healthy: true, Reason: "quiet for 10m0s since NVML reports the card unhealthy"}})

	h, c = scan(false, true)
	check("NVML alone marks a card", h, c, []bool{false, true}, []Transition{{UUID: "a", Healthy: false, Reason: "NVML reports the card unhealthy"}})
}
