package gpushare

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	tt "github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// pendingPod is an unbound GPU pod whose last attempt failed with message.
func pendingPod(name, message string, limits map[v1.ResourceName]string) *v1.Pod {
	p := gpuPod(name, limits).Obj()
	p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: message}}
	return p
}

// TestMetrics: the collector reports each card's capacity, allocation, pods
// and health from the ledger, the fleet's totals and card states, and the
// pending GPU pods by reason — figures worked out by hand from the objects.
func TestMetrics(t *testing.T) {
	sick := tt.Inventory("s", "Tesla T4", 16384, 1)
	sick.Cards[0].Healthy = false
	harnessOf(t, nil, false,
		tt.GPUNode("a100", tt.Inventory("a", "A100", 81920, 2)),
		tt.GPUNode("t4", sick),
		tt.GPUNode("mig", tt.MIGInventory("m", []string{"1g.5gb@0", "3g.20gb@4"})),
		boundPod("three", "mig", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-m-0", MemoryMiB: 4864, Cores: 100, MIG: &gpuinfo.MIGSlice{Profile: "1g.5gb", Start: 0, UUID: "MIG-m-0-0"}}}}),
		pendingPod("sliced", "0/3 nodes are available: 1 no free MIG slice has 30000 MiB, 2 no GPU in MIG mode with a healthy slice.", tt.Share(30000, 0)),
		boundPod("one", "a100", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-a-0", MemoryMiB: 10240, Cores: 30}}}),
		boundPod("two", "a100", map[string][]gpuinfo.CardAssignment{"c": {{Index: 0, UUID: "GPU-a-0", MemoryMiB: 20480, Cores: 20}}}),
		pendingPod("big", "0/2 nodes are available: 1 no GPU has 90000 MiB free. GPUs: ...", tt.Share(90000, 0)),
		pendingPod("picky", "0/2 nodes are available: 2 no GPU matches model h100.", tt.Cards(1)),
		pendingPod("cpu-only", "0/2 nodes are available: 2 Insufficient cpu.", nil),
		st.MakePod().Name("bound-cpu").Namespace("default").Node("a100").Obj(),
		agentLease("a100", time.Now()),
	)
	want := `
# HELP tessera_gpu_card_cores_allocated_percent [ALPHA] Compute of the card held by pods placed on it, percent of the card.
# TYPE tessera_gpu_card_cores_allocated_percent gauge
tessera_gpu_card_cores_allocated_percent{card="0",model="A100",node="a100"} 50
tessera_gpu_card_cores_allocated_percent{card="1",model="A100",node="a100"} 0
tessera_gpu_card_cores_allocated_percent{card="0",model="Tesla T4",node="t4"} 0
tessera_gpu_card_cores_allocated_percent{card="0",model="NVIDIA A100-SXM4-40GB",node="mig"} 0
# HELP tessera_gpu_card_healthy [ALPHA] 1 when the card is healthy (in MIG mode, its slices take its pods), else 0.
# TYPE tessera_gpu_card_healthy gauge
tessera_gpu_card_healthy{card="0",model="A100",node="a100"} 1
tessera_gpu_card_healthy{card="1",model="A100",node="a100"} 1
tessera_gpu_card_healthy{card="0",model="Tesla T4",node="t4"} 0
tessera_gpu_card_healthy{card="0",model="NVIDIA A100-SXM4-40GB",node="mig"} 1
# HELP tessera_gpu_card_memory_allocated_mib [ALPHA] GPU memory of the card held by pods placed on it (bound or being bound), MiB.
# TYPE tessera_gpu_card_memory_allocated_mib gauge
tessera_gpu_card_memory_allocated_mib{card="0",model="A100",node="a100"} 30720
tessera_gpu_card_memory_allocated_mib{card="1",model="A100",node="a100"} 0
tessera_gpu_card_memory_allocated_mib{card="0",model="Tesla T4",node="t4"} 0
tessera_gpu_card_memory_allocated_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig"} 0
# HELP tessera_gpu_card_memory_capacity_mib [ALPHA] GPU memory of the card, MiB, as its node's agent reports it.
# TYPE tessera_gpu_card_memory_capacity_mib gauge
tessera_gpu_card_memory_capacity_mib{card="0",model="A100",node="a100"} 81920
tessera_gpu_card_memory_capacity_mib{card="1",model="A100",node="a100"} 81920
tessera_gpu_card_memory_capacity_mib{card="0",model="Tesla T4",node="t4"} 16384
tessera_gpu_card_memory_capacity_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig"} 40960
# HELP tessera_gpu_card_pods [ALPHA] Pods holding part of the card.
# TYPE tessera_gpu_card_pods gauge
tessera_gpu_card_pods{card="0",model="A100",node="a100"} 2
tessera_gpu_card_pods{card="1",model="A100",node="a100"} 0
tessera_gpu_card_pods{card="0",model="Tesla T4",node="t4"} 0
tessera_gpu_card_pods{card="0",model="NVIDIA A100-SXM4-40GB",node="mig"} 0
# HELP tessera_gpu_fleet_cards [ALPHA] Cards by state: free (nothing on it), shared (partly held), full (no memory or compute left), mig (in MIG mode), unhealthy.
# TYPE tessera_gpu_fleet_cards gauge
tessera_gpu_fleet_cards{state="free"} 1
tessera_gpu_fleet_cards{state="full"} 0
tessera_gpu_fleet_cards{state="mig"} 1
tessera_gpu_fleet_cards{state="shared"} 1
tessera_gpu_fleet_cards{state="unhealthy"} 1
# HELP tessera_gpu_fleet_memory_allocated_mib [ALPHA] GPU memory held by pods on those cards and slices, MiB.
# TYPE tessera_gpu_fleet_memory_allocated_mib gauge
tessera_gpu_fleet_memory_allocated_mib 35584
# HELP tessera_gpu_fleet_memory_capacity_mib [ALPHA] GPU memory of every healthy card not in MIG mode and every healthy MIG slice, MiB.
# TYPE tessera_gpu_fleet_memory_capacity_mib gauge
tessera_gpu_fleet_memory_capacity_mib 188672
# HELP tessera_gpu_mig_slice_healthy [ALPHA] 1 when the MIG slice takes new pods, else 0.
# TYPE tessera_gpu_mig_slice_healthy gauge
tessera_gpu_mig_slice_healthy{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="1g.5gb@0"} 1
tessera_gpu_mig_slice_healthy{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="3g.20gb@4"} 1
# HELP tessera_gpu_mig_slice_memory_allocated_mib [ALPHA] GPU memory of the MIG slice held by pods placed on it, MiB.
# TYPE tessera_gpu_mig_slice_memory_allocated_mib gauge
tessera_gpu_mig_slice_memory_allocated_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="1g.5gb@0"} 4864
tessera_gpu_mig_slice_memory_allocated_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="3g.20gb@4"} 0
# HELP tessera_gpu_mig_slice_memory_capacity_mib [ALPHA] GPU memory of the MIG slice (profile@start), MiB.
# TYPE tessera_gpu_mig_slice_memory_capacity_mib gauge
tessera_gpu_mig_slice_memory_capacity_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="1g.5gb@0"} 4864
tessera_gpu_mig_slice_memory_capacity_mib{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="3g.20gb@4"} 19968
# HELP tessera_gpu_mig_slice_pods [ALPHA] Pods holding the MIG slice or part of it.
# TYPE tessera_gpu_mig_slice_pods gauge
tessera_gpu_mig_slice_pods{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="1g.5gb@0"} 1
tessera_gpu_mig_slice_pods{card="0",model="NVIDIA A100-SXM4-40GB",node="mig",slice="3g.20gb@4"} 0
# HELP tessera_gpu_agent_ready [ALPHA] 0 while the node's GPU agent says it cannot enforce assignments (tessera.io/agent-not-ready on its Lease), else 1.
# TYPE tessera_gpu_agent_ready gauge
tessera_gpu_agent_ready{node="a100"} 1
# HELP tessera_gpu_pending_pods [ALPHA] GPU pods the scheduler marked unschedulable, by the main GPU reason of their last attempt.
# TYPE tessera_gpu_pending_pods gauge
tessera_gpu_pending_pods{reason="agent"} 0
tessera_gpu_pending_pods{reason="cards"} 0
tessera_gpu_pending_pods{reason="compute"} 0
tessera_gpu_pending_pods{reason="invalid_request"} 0
tessera_gpu_pending_pods{reason="memory"} 1
tessera_gpu_pending_pods{reason="mig"} 1
tessera_gpu_pending_pods{reason="model"} 1
tessera_gpu_pending_pods{reason="no_gpus"} 0
tessera_gpu_pending_pods{reason="other"} 0
tessera_gpu_pending_pods{reason="reserved"} 0
tessera_gpu_pending_pods{reason="unhealthy"} 0
tessera_gpu_pending_pods{reason="whole_card"} 0
`
	c := &collector{}
	if err := testutil.CustomCollectAndCompare(c, strings.NewReader(want),
		"tessera_gpu_card_cores_allocated_percent", "tessera_gpu_card_healthy", "tessera_gpu_card_memory_allocated_mib",
		"tessera_gpu_card_memory_capacity_mib", "tessera_gpu_card_pods", "tessera_gpu_fleet_cards",
		"tessera_gpu_fleet_memory_allocated_mib", "tessera_gpu_fleet_memory_capacity_mib", "tessera_gpu_pending_pods", "tessera_gpu_agent_ready",
		"tessera_gpu_mig_slice_memory_capacity_mib", "tessera_gpu_mig_slice_memory_allocated_mib", "tessera_gpu_mig_slice_pods", "tessera_gpu_mig_slice_healthy"); err != nil {
		t.Error(err)
	}
}

// TestMetricsDocumented: the scheduler exports exactly the metrics
// docs/observability.md lists (the alert rules are checked against that
// list).
func TestMetricsDocumented(t *testing.T) {
	ch := make(chan *metrics.Desc, 32)
	(&collector{}).DescribeWithStability(ch)
	close(ch)
	var got []string
	for d := range ch {
		got = append(got, tt.DescName(d.String()))
	}
	sort.Strings(got)
	if diff := cmp.Diff(tt.DocumentedMetrics(t, "Scheduler metrics"), got); diff != "" {
		t.Errorf("exported metrics (-documented,+exported):\n%s", diff)
	}
}
