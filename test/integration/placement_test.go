package integration

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/internal/cluster"
)

var share4GiB30 = map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 30}

// TestBinpackSharesOneCard: once a card holds a share, binpack puts the
// next shares on that same card rather than on any other card or node.
func TestBinpackSharesOneCard(t *testing.T) {
	e := newEnv(t)
	a := e.node("a", cluster.A100, 4, nil)
	e.node("b", cluster.A100, 4, nil)
	e.startScheduler()
	holder := e.podSpec("holder", "tessera-binpack", share4GiB30)
	holder.Spec.NodeSelector = map[string]string{v1.LabelHostname: a}
	e.create(holder)
	want := placementOf(t, e.waitBound(30*time.Second, "holder")["holder"])
	for _, name := range []string{"first", "second"} {
		e.create(e.podSpec(name, "tessera-binpack", share4GiB30))
		if diff := cmp.Diff(want, placementOf(t, e.waitBound(30*time.Second, name)[name])); diff != "" {
			t.Errorf("binpack placed %s off the partly used card (-holder,+%s):\n%s", name, name, diff)
		}
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

// TestPodsWithoutGPUsAvoidGPUNodes: in every shipped profile a pod that asks
// for no GPUs goes to the node without GPUs, though the GPU node, busier
// with CPU, is where kube-scheduler's packing of CPU alone would put it:
// CPU taken on a GPU node can strand its free cards.
func TestPodsWithoutGPUsAvoidGPUNodes(t *testing.T) {
	e := newEnv(t)
	gpuNode := e.node("gpu", cluster.A100, 8, nil)
	plain := e.plainNode("plain")
	e.startScheduler()
	busy := e.podSpec("busy", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 4096, "cpu": 16})
	busy.Spec.NodeSelector = map[string]string{v1.LabelHostname: gpuNode}
	e.create(busy)
	e.waitBound(30*time.Second, "busy")
	for _, profile := range []string{"tessera-binpack", "tessera-spread", "tessera-fragmentation-aware"} {
		e.create(e.podSpec("web-"+profile, profile, map[string]int64{"cpu": 2}))
		if got := e.waitBound(30*time.Second, "web-"+profile)["web-"+profile].Spec.NodeName; got != plain {
			t.Errorf("%s put a pod without GPUs on %s, want the node without GPUs %s", profile, got, plain)
		}
	}
}
