package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// TestTopologyNVLinkQuads: on a node of two NVLink quads, published by the
// agent's code with its links (inventory version 2), the real scheduler
// gives a 4-card pod that requires NVLink a whole quad; while a card of each
// quad is held it stays Pending saying no four linked cards are free, and
// it binds to the quad whose card is freed.
func TestTopologyNVLinkQuads(t *testing.T) {
	e := newEnv(t)
	quads := e.node("quads", cluster.H100+",topology="+topology.NVLinkQuads, 8, nil)
	e.startScheduler()
	holder := func(name string, card int) *v1.Pod {
		pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
		pod.Annotations = map[string]string{gpuinfo.UUIDAnnotation: fmt.Sprintf("GPU-sim-%s-%d", quads, card)}
		return pod
	}
	fourLinked := func(name string) *v1.Pod {
		pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu": 4})
		pod.Annotations = map[string]string{gpuinfo.TopologyAnnotation: "nvlink"}
		return pod
	}
	cards := func(pod *v1.Pod) []int {
		var idx []int
		for _, c := range assignment(t, pod).Containers["main"] {
			idx = append(idx, c.Index)
		}
		return idx
	}
	oneQuad := func(idx []int) bool {
		for _, i := range idx {
			if i/4 != idx[0]/4 {
				return false
			}
		}
		return len(idx) == 4
	}

	e.create(holder("holds-1", 1))
	e.waitBound(30*time.Second, "holds-1")
	e.create(fourLinked("first"))
	if got := cards(e.waitBound(30*time.Second, "first")["first"]); !oneQuad(got) || got[0] != 4 {
		t.Errorf("the first 4-card pod got cards %v, want the free quad 4-7", got)
	}
	e.deletePod("first")
	e.create(holder("holds-5", 5))
	e.waitBound(30*time.Second, "holds-5")
	e.create(fourLinked("second"))
	if msg := e.waitUnschedulable("second"); !strings.Contains(msg, "no 4 free GPUs linked by nvlink") ||
		!strings.Contains(msg, "1 node with no 4 GPUs with room linked by nvlink") {
		t.Errorf("pending message %q does not say that no four linked cards are free", msg)
	}
	e.deletePod("holds-5")
	if got := cards(e.waitBound(30*time.Second, "second")["second"]); !oneQuad(got) || got[0] != 4 {
		t.Errorf("the second 4-card pod got cards %v, want the freed quad 4-7", got)
	}
	e.checkNoOvercommit(t)
}
