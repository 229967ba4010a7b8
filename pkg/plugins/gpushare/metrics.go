package gpushare

import (
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// The scheduler's metrics, in kube-scheduler's own registry (served on its
// secure port's /metrics). They are read from the ledger when scraped, never
// on the scheduling path. Cardinality: per card (nodes × cards × 5 series),
// per card state, per pending reason; never per pod. docs/observability.md
// lists them.
var (
	cardLabels = []string{"node", "card", "model"}

	cardMemoryCapacity = metrics.NewDesc("tessera_gpu_card_memory_capacity_mib",
		"GPU memory of the card, MiB, as its node's agent reports it.", cardLabels, nil, metrics.ALPHA, "")
	cardMemoryAllocated = metrics.NewDesc("tessera_gpu_card_memory_allocated_mib",
		"GPU memory of the card held by pods placed on it (bound or being bound), MiB.", cardLabels, nil, metrics.ALPHA, "")
	cardCoresAllocated = metrics.NewDesc("tessera_gpu_card_cores_allocated_percent",
		"Compute of the card held by pods placed on it, percent of the card.", cardLabels, nil, metrics.ALPHA, "")
	cardPods = metrics.NewDesc("tessera_gpu_card_pods",
		"Pods holding part of the card.", cardLabels, nil, metrics.ALPHA, "")
	cardHealthy = metrics.NewDesc("tessera_gpu_card_healthy",
		"1 when the card is healthy (in MIG mode, its slices take its pods), else 0.", cardLabels, nil, metrics.ALPHA, "")
	sliceLabels = []string{"node", "card", "model", "slice"}

	sliceMemoryCapacity = metrics.NewDesc("tessera_gpu_mig_slice_memory_capacity_mib",
		"GPU memory of the MIG slice (profile@start), MiB.", sliceLabels, nil, metrics.ALPHA, "")
	sliceMemoryAllocated = metrics.NewDesc("tessera_gpu_mig_slice_memory_allocated_mib",
		"GPU memory of the MIG slice held by pods placed on it, MiB.", sliceLabels, nil, metrics.ALPHA, "")
	slicePods = metrics.NewDesc("tessera_gpu_mig_slice_pods",
		"Pods holding the MIG slice or part of it.", sliceLabels, nil, metrics.ALPHA, "")
	sliceHealthy = metrics.NewDesc("tessera_gpu_mig_slice_healthy",
		"1 when the MIG slice takes new pods, else 0.", sliceLabels, nil, metrics.ALPHA, "")
	fleetMemoryCapacity = metrics.NewDesc("tessera_gpu_fleet_memory_capacity_mib",
		"GPU memory of every healthy card not in MIG mode and every healthy MIG slice, MiB.", nil, nil, metrics.ALPHA, "")
	fleetMemoryAllocated = metrics.NewDesc("tessera_gpu_fleet_memory_allocated_mib",
		"GPU memory held by pods on those cards and slices, MiB.", nil, nil, metrics.ALPHA, "")
	fleetCards = metrics.NewDesc("tessera_gpu_fleet_cards",
		"Cards by state: free (nothing on it), shared (partly held), full (no memory or compute left), mig (in MIG mode), unhealthy.", []string{"state"}, nil, metrics.ALPHA, "")
	fleetFragmentation = metrics.NewDesc("tessera_gpu_fleet_fragmentation_ratio",
		"Share of the fleet's free GPU that the requests the scheduler has recently seen could not use (the fragmentation-aware policy's measure, CPU left aside); 0 when nothing is free.", nil, nil, metrics.ALPHA, "")
	agentHeartbeatAge = metrics.NewDesc("tessera_gpu_agent_heartbeat_age_seconds",
		"Time since the node's GPU agent last renewed its heartbeat Lease (nodes with a Lease).", []string{"node"}, nil, metrics.ALPHA, "")
	agentReady = metrics.NewDesc("tessera_gpu_agent_ready",
		"0 while the node's GPU agent says it cannot enforce assignments (tessera.io/agent-not-ready on its Lease), else 1.", []string{"node"}, nil, metrics.ALPHA, "")
	pendingPods = metrics.NewDesc("tessera_gpu_pending_pods",
		"GPU pods the scheduler marked unschedulable, by the main GPU reason of their last attempt.", []string{"reason"}, nil, metrics.ALPHA, "")
)

// pendingReasons classifies a pending pod's PodScheduled message, first
// match wins; the reasons are the label's values.
var pendingReasons = []struct{ label, marker string }{
	{"invalid_request", "invalid GPU request"},
	{"agent", "GPU agent"},
	{"reserved", "reserved"},
	{"model", "no GPU matches"},
	{"unhealthy", "no healthy GPU"},
	{"memory", "MiB free"},
	{"compute", "compute free"},
	{"cards", "GPUs have room"},
	{"whole_card", "entirely free"},
	{"mig", "MIG"},
	{"no_gpus", "node has no GPUs"},
}

var registerMetrics sync.Once

// registerCollector adds the plugin's collector to kube-scheduler's
// registry, once per process; it reads whichever feeds are live.
func registerCollector() {
	registerMetrics.Do(func() { legacyregistry.CustomMustRegister(&collector{}) })
}

// collector reads the live feeds' ledgers and pods when scraped.
type collector struct {
	metrics.BaseStableCollector
}

// DescribeWithStability lists the metrics.
func (c *collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{cardMemoryCapacity, cardMemoryAllocated, cardCoresAllocated, cardPods, cardHealthy,
		sliceMemoryCapacity, sliceMemoryAllocated, slicePods, sliceHealthy,
		fleetMemoryCapacity, fleetMemoryAllocated, fleetCards, fleetFragmentation, agentHeartbeatAge, agentReady, pendingPods} {
		ch <- d
	}
}

// CollectWithStability reports the newest live feed (a process runs one
// scheduler; tests may leave others behind).
func (c *collector) CollectWithStability(ch chan<- metrics.Metric) {
	f := newestFeed()
	if f == nil {
		return
	}
	var capacity, allocated float64
	states := map[string]float64{"free": 0, "shared": 0, "full": 0, "mig": 0, "unhealthy": 0}
	for node, cards := range f.ledger.Snapshot() {
		for _, card := range cards {
			if card.Slice != nil && !card.Slice.Exists() && card.Pods == 0 {
				continue // a placement of a dynamic card, not a device
			}
			healthy := 0.0
			if card.Healthy {
				healthy = 1
			}
			if card.Healthy && !card.MIG {
				capacity += float64(card.Capacity.MemoryMiB)
				allocated += float64(card.Used.MemoryMiB)
			}
			if card.Slice != nil {
				labels := []string{node, strconv.Itoa(card.Index), card.Model, card.Slice.Name()}
				ch <- metrics.NewLazyConstMetric(sliceMemoryCapacity, metrics.GaugeValue, float64(card.Capacity.MemoryMiB), labels...)
				ch <- metrics.NewLazyConstMetric(sliceMemoryAllocated, metrics.GaugeValue, float64(card.Used.MemoryMiB), labels...)
				ch <- metrics.NewLazyConstMetric(slicePods, metrics.GaugeValue, float64(card.Pods), labels...)
				ch <- metrics.NewLazyConstMetric(sliceHealthy, metrics.GaugeValue, healthy, labels...)
				continue
			}
			labels := []string{node, strconv.Itoa(card.Index), card.Model}
			ch <- metrics.NewLazyConstMetric(cardMemoryCapacity, metrics.GaugeValue, float64(card.Capacity.MemoryMiB), labels...)
			ch <- metrics.NewLazyConstMetric(cardMemoryAllocated, metrics.GaugeValue, float64(card.Used.MemoryMiB), labels...)
			ch <- metrics.NewLazyConstMetric(cardCoresAllocated, metrics.GaugeValue, float64(card.Used.Cores), labels...)
			ch <- metrics.NewLazyConstMetric(cardPods, metrics.GaugeValue, float64(card.Pods), labels...)
			ch <- metrics.NewLazyConstMetric(cardHealthy, metrics.GaugeValue, healthy, labels...)
			states[cardState(card)]++
		}
	}
	ch <- metrics.NewLazyConstMetric(fleetMemoryCapacity, metrics.GaugeValue, capacity)
	ch <- metrics.NewLazyConstMetric(fleetMemoryAllocated, metrics.GaugeValue, allocated)
	for state, n := range states {
		ch <- metrics.NewLazyConstMetric(fleetCards, metrics.GaugeValue, n, state)
	}
	fragmented, free := f.ledger.Fragmentation(f.workload())
	ratio := 0.0
	if free > 0 {
		ratio = fragmented / free
	}
	ch <- metrics.NewLazyConstMetric(fleetFragmentation, metrics.GaugeValue, ratio)
	for _, hb := range f.records.heartbeats() {
		ch <- metrics.NewLazyConstMetric(agentHeartbeatAge, metrics.GaugeValue, time.Since(hb.renewed).Seconds(), hb.node)
		ready := 1.0
		if hb.notReady != nil {
			ready = 0
		}
		ch <- metrics.NewLazyConstMetric(agentReady, metrics.GaugeValue, ready, hb.node)
	}
	for reason, n := range f.pendingByReason() {
		ch <- metrics.NewLazyConstMetric(pendingPods, metrics.GaugeValue, float64(n), reason)
	}
}

// pendingByReason counts the unbound GPU pods marked unschedulable, by the
// reason their PodScheduled condition gives; every label value appears, so
// a reason that clears drops to 0 rather than vanishing.
func (f *feed) pendingByReason() map[string]int {
	counts := map[string]int{"other": 0}
	for _, r := range pendingReasons {
		counts[r.label] = 0
	}
	for _, obj := range f.pods.List() {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
			continue
		}
		msg, unschedulable := unschedulableMessage(pod)
		if !unschedulable {
			continue
		}
		// A pod asks for GPUs when the contract finds a request, valid or not.
		if req, err := gpuinfo.ParsePodRequest(pod, f.names); req == nil && err == nil {
			continue
		}
		reason := "other"
		for _, r := range pendingReasons {
			if strings.Contains(msg, r.marker) {
				reason = r.label
				break
			}
		}
		counts[reason]++
	}
	return counts
}

// unschedulableMessage is the pod's PodScheduled=False message, if it has
// one with reason Unschedulable.
func unschedulableMessage(pod *v1.Pod) (string, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// cardState is a card's state for tessera_gpu_fleet_cards.
func cardState(card ledger.CardUsage) string {
	switch {
	case !card.Healthy:
		return "unhealthy"
	case card.MIG:
		return "mig"
	case card.Used.MemoryMiB >= card.Capacity.MemoryMiB || card.Used.Cores >= card.Capacity.Cores:
		return "full"
	case card.Pods > 0:
		return "shared"
	}
	return "free"
}
