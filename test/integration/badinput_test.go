package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestBadInventoriesAreReportedAndSkipped(t *testing.T) {
	e := newEnv(t)
	good := e.node("good", cluster.A100, 2, nil)
	bad := map[string]string{
		"not-json":  `{"version":1,"cards":[`,
		"negative":  `{"version":1,"cards":[{"index":0,"uuid":"u","model":"X","memoryMiB":-81920,"cores":100,"healthy":true}]}`,
		"10k-cards": testutil.EmptyCards(10000),
		"dup-index": `{"version":1,"cards":[{"index":0,"uuid":"a","model":"X","memoryMiB":81920,"cores":100,"healthy":true},{"index":0,"uuid":"b","model":"X","memoryMiB":81920,"cores":100,"healthy":true}]}`,
		// Links claimed for pairs that do not exist, or in another alphabet.
		"links-length": `{"version":2,"links":"VVVV","cards":[{"index":0,"uuid":"a","model":"X","memoryMiB":81920,"cores":100,"healthy":true},{"index":1,"uuid":"b","model":"X","memoryMiB":81920,"cores":100,"healthy":true}]}`,
		"links-letter": `{"version":2,"links":"Z","cards":[{"index":0,"uuid":"a","model":"X","memoryMiB":81920,"cores":100,"healthy":true},{"index":1,"uuid":"b","model":"X","memoryMiB":81920,"cores":100,"healthy":true}]}`,
	}
	// A broken agent could write these; the admission policies let it, on
	// its own node.
	for suffix, raw := range bad {
		e.publishInventory(e.plainNode(suffix), raw)
	}
	e.startScheduler()
	var names []string
	for i := 0; i < 6; i++ {
		name := fmt.Sprint("gpu-", i)
		names = append(names, name)
		e.create(e.podSpec(name, "tessera-spread", map[string]int64{"tessera.io/gpu-memory": 1024}))
	}
	e.create(e.podSpec("cpu-only", "tessera-spread", nil))
	for name, p := range e.waitBound(30*time.Second, append(names, "cpu-only")...) {
		if strings.HasPrefix(name, "gpu-") && p.Spec.NodeName != good {
			t.Errorf("pod %s was placed on %s, whose inventory is invalid", name, p.Spec.NodeName)
		}
	}
	for suffix := range bad {
		name := e.ns + "-" + suffix
		e.waitFor(30*time.Second, "an InvalidGPUInventory event on "+name, func() (bool, error) {
			events, err := e.client.EventsV1().Events(v1.NamespaceDefault).List(e.tCtx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("regarding.name", name).String(),
			})
			if err != nil {
				return false, err
			}
			for _, ev := range events.Items {
				if ev.Reason == "InvalidGPUInventory" && strings.Contains(ev.Note, gpuinfo.InventoryAnnotation) {
					return true, nil
				}
			}
			return false, nil
		})
	}
}

func TestCoexistsWithOtherPlugins(t *testing.T) {
	e := newEnv(t)
	east := e.node("east", cluster.A100, 2, map[string]string{"zone": "east"})
	e.node("west", cluster.A100, 2, map[string]string{"zone": "west"})
	tainted := e.node("tainted", cluster.A100, 8, map[string]string{"zone": "east"})
	n, err := e.client.CoreV1().Nodes().Get(e.tCtx, tainted, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []v1.Taint{{Key: "dedicated", Value: "training", Effect: v1.TaintEffectNoSchedule}}
	if _, err := e.client.CoreV1().Nodes().Update(e.tCtx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	plain := e.plainNode("plain")
	e.startScheduler()

	// Node affinity narrows the GPU nodes: only east qualifies (tainted is
	// east too, but its taint is not tolerated).
	affine := e.podSpec("affine", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
	affine.Spec.NodeSelector = map[string]string{"zone": "east"}
	e.create(affine)
	// A pod tolerating the taint may use the tainted node.
	tolerant := e.podSpec("tolerant", "tessera-binpack", map[string]int64{"tessera.io/gpu": 8})
	tolerant.Spec.Tolerations = []v1.Toleration{{Key: "dedicated", Operator: v1.TolerationOpEqual, Value: "training", Effect: v1.TaintEffectNoSchedule}}
	e.create(tolerant)
	// Pods without GPUs schedule as usual, also on nodes without GPUs.
	cpu := e.podSpec("cpu", "tessera-binpack", nil)
	cpu.Spec.NodeSelector = map[string]string{v1.LabelHostname: plain}
	e.create(cpu)
	bound := e.waitBound(30*time.Second, "affine", "tolerant", "cpu")
	for name, want := range map[string]string{"affine": east, "tolerant": tainted, "cpu": plain} {
		if got := bound[name].Spec.NodeName; got != want {
			t.Errorf("%s bound to %s, want %s", name, got, want)
		}
	}
	if _, ok := bound["cpu"].Annotations[gpuinfo.AssignmentAnnotation]; ok {
		t.Error("a pod without GPUs got an assignment")
	}
}
