package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestSchedulerMetricsMatchAssignments: after pods are placed, the running
// scheduler's registry (the one its /metrics endpoint serves) reports, for
// each card of the test's nodes, the memory and compute the pods' assignments
// hold there — recomputed from the API with the contract's rules, apart from
// the scheduler's code — and how many pods share it.
func TestSchedulerMetricsMatchAssignments(t *testing.T) {
	e := newEnv(t)
	a := e.node("a", cluster.A100, 2, nil)
	b := e.node("b", cluster.T4, 2, nil)
	e.startScheduler()
	var names []string
	for i, share := range []map[string]int64{
		{"tessera.io/gpu-memory": 20480, "tessera.io/gpu-cores": 30},
		{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 10},
		{"tessera.io/gpu-memory-percent": 50},
		{"tessera.io/gpu": 1},
		{"tessera.io/gpu-memory": 8192},
	} {
		names = append(names, fmt.Sprint("p", i))
		e.create(e.podSpec(names[i], "tessera-binpack", share))
	}
	e.waitBound(60*time.Second, names...)

	u := e.usage(t)
	key := func(uuid string) string { return fmt.Sprintf("%s/%d", u.where[uuid].node, u.where[uuid].index) }
	sharing := map[string]float64{}
	for _, p := range u.pods {
		asg, err := gpuinfo.DecodeAssignment(p.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, entries := range asg.Containers {
			for _, c := range entries {
				if !seen[c.UUID] {
					seen[c.UUID] = true
					sharing[key(c.UUID)]++
				}
			}
		}
	}
	wantMemory, wantCores, wantPods := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for uuid := range u.where {
		wantMemory[key(uuid)] = float64(u.held[uuid].MemoryMiB)
		wantCores[key(uuid)] = float64(u.held[uuid].Cores)
		wantPods[key(uuid)] = sharing[key(uuid)]
	}

	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]bool{a: true, b: true}
	got := map[string]map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if !ours[labels["node"]] {
				continue
			}
			if got[mf.GetName()] == nil {
				got[mf.GetName()] = map[string]float64{}
			}
			got[mf.GetName()][labels["node"]+"/"+labels["card"]] = m.GetGauge().GetValue()
		}
	}
	for name, want := range map[string]map[string]float64{
		"tessera_gpu_card_memory_allocated_mib":    wantMemory,
		"tessera_gpu_card_cores_allocated_percent": wantCores,
		"tessera_gpu_card_pods":                    wantPods,
	} {
		if diff := cmp.Diff(want, got[name]); diff != "" {
			t.Errorf("%s per node/card (-from the assignments,+scraped):\n%s", name, diff)
		}
	}
}
