package integration

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/cluster"
)

var share4GiB30 = map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 30}

func TestBinpackSharesOneCard(t *testing.T) {
	e := newEnv(t)
	a := e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.startScheduler()
	e.create(e.podSpec("first", "tessera-binpack", share4GiB30))
	first := placementOf(t, e.waitBound(30*time.Second, "first")["first"])
	e.create(e.podSpec("second", "tessera-binpack", share4GiB30))
	second := placementOf(t, e.waitBound(30*time.Second, "second")["second"])
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("binpack placed the second pod elsewhere (-first,+second):\n%s", diff)
	}
	if first.Node != a && first.Node != e.ns+"-b" || len(first.Cards) != 1 {
		t.Errorf("unexpected placement %+v", first)
	}
}

func TestSpreadUsesDifferentCards(t *testing.T) {
	e := newEnv(t)
	e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.startScheduler()
	e.create(e.podSpec("first", "tessera-spread", share4GiB30))
	first := placementOf(t, e.waitBound(30*time.Second, "first")["first"])
	e.create(e.podSpec("second", "tessera-spread", share4GiB30))
	second := placementOf(t, e.waitBound(30*time.Second, "second")["second"])
	if first.Node == second.Node && cmp.Equal(first.Cards, second.Cards) {
		t.Errorf("spread put both pods on %+v", first)
	}
	if first.Node == second.Node {
		t.Errorf("spread put both pods on node %s while another node was empty", first.Node)
	}
}
