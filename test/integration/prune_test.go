package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestPrunedNodesStillExplained: on a fleet of six one-card nodes, five full,
// PreFilter keeps only the node with room (the others' Filter never runs): a
// shared pod binds there, and a pod no node can hold is still explained for
// all six, pruned ones included.
func TestPrunedNodesStillExplained(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 6; i++ {
		e.node(fmt.Sprint("n", i), cluster.T4, 1, nil)
	}
	e.startScheduler()
	var full []string
	for i := 0; i < 5; i++ {
		full = append(full, fmt.Sprint("whole-", i))
		e.create(e.podSpec(full[i], "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	}
	e.waitBound(60*time.Second, full...)
	e.create(e.podSpec("share", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 8192}))
	e.waitBound(30*time.Second, "share")
	picky := e.podSpec("picky", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 1024})
	picky.Annotations = map[string]string{gpuinfo.ModelAnnotation: "A100"}
	e.create(picky)
	msg := e.waitUnschedulable("picky")
	// Five nodes were left out by PreFilter, one rejected by Filter; the
	// summary covers all six.
	for _, want := range []string{"5 node(s) didn't satisfy plugin(s) [GPUShare]", "6 nodes with no GPU matching model a100"} {
		if !strings.Contains(msg, want) {
			t.Errorf("PodScheduled message %q does not say %q", msg, want)
		}
	}
	e.checkNoOvercommit(t)
}
