package fleet

import (
	"strings"
	"testing"
	"time"
)

func TestAgentBlocked(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name               string
		agent              Agent
		wantState, wantMsg string
	}{
		{name: "no lease", agent: Agent{}},
		{name: "fresh", agent: Agent{Lease: true, Renewed: now.Add(-10 * time.Second)}},
		{name: "silent", agent: Agent{Lease: true, Renewed: now.Add(-3 * time.Minute)},
			wantState: "agent silent", wantMsg: "GPU agent on node n not reporting for 3m0s"},
		{name: "silent wins over not ready", agent: Agent{Lease: true, Renewed: now.Add(-3 * time.Minute), HasNotReady: true, NotReady: "x"},
			wantState: "agent silent", wantMsg: "GPU agent on node n not reporting for 3m0s"},
		{name: "not ready", agent: Agent{Lease: true, Renewed: now, HasNotReady: true, NotReady: "NRI plugin not connected"},
			wantState: "agent not ready", wantMsg: "GPU agent on node n cannot enforce GPU assignments: NRI plugin not connected"},
		{name: "long reason cut", agent: Agent{Lease: true, Renewed: now, HasNotReady: true, NotReady: strings.Repeat("x", 300)},
			wantState: "agent not ready", wantMsg: "GPU agent on node n cannot enforce GPU assignments: " + strings.Repeat("x", 256) + "..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, msg := tc.agent.Blocked("n", now, HeartbeatTimeout)
			if state != tc.wantState || msg != tc.wantMsg {
				t.Errorf("Blocked = %q, %q; want %q, %q", state, msg, tc.wantState, tc.wantMsg)
			}
		})
	}
}
