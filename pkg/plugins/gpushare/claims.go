package gpushare

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// GPU shares as DRA claims. kube-scheduler's DynamicResources plugin decides
// whether a node can satisfy a pod's claims and allocates them (first fit,
// in the driver's device order); it does not prefer one feasible node over
// another by free capacity. GPUShare scores the nodes for a pod whose claims
// ask Tessera's cards the way it scores an extended-resource pod: each claim
// request is a container asking its count of cards with its memory and
// compute, placed by the profile's policy on the node's cards as the
// ResourceSlices publish them, less what allocated claims (pending ones
// included) consume. So binpack, spread and fragmentation-aware mean the
// same for both APIs.

// claimStateKey is the cycle state key of a pod with Tessera claims.
const claimStateKey fwk.StateKey = Name + "/claims"

// claimState is what Score needs for a pod with Tessera claims.
type claimState struct {
	req      *gpuinfo.PodRequest
	nodes    map[string]*claimNode
	workload *allocator.Workload
	cpuMilli int64
}

// claimNode is a node's Tessera cards and what allocated claims consume
// of each.
type claimNode struct {
	cards []allocator.Card
	used  []allocator.Usage
}

// Clone returns the state itself: it is not changed after PreScore.
func (c *claimState) Clone() fwk.StateData { return c }

func getClaimState(state fwk.CycleState) *claimState {
	v, err := state.Read(claimStateKey)
	if err != nil {
		return nil
	}
	c, _ := v.(*claimState)
	return c
}

// preScoreClaims writes the claim state of a pod with Tessera claims and
// reports whether it has any.
func (p *Plugin) preScoreClaims(state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) bool {
	req := p.claimRequest(pod)
	if req == nil {
		return false
	}
	names := sets.New[string]()
	for _, n := range nodes {
		names.Insert(n.Node().Name)
	}
	c := &claimState{req: req, nodes: p.claimNodes(names)}
	if p.usesWorkload() {
		c.workload, c.cpuMilli = p.workload(), podCPUMilli(pod)
	}
	state.Write(claimStateKey, c)
	return true
}

// claimRequest is the request of the pod's unallocated claims for Tessera's
// cards, one container per device request; nil when there is none. A claim
// or class the scheduler does not have yet is left to DynamicResources,
// which waits for it.
func (p *Plugin) claimRequest(pod *v1.Pod) *gpuinfo.PodRequest {
	dra := p.handle.SharedDRAManager()
	if dra == nil || len(pod.Spec.ResourceClaims) == 0 {
		return nil
	}
	var req gpuinfo.PodRequest
	for _, pc := range pod.Spec.ResourceClaims {
		name := claimName(pod, pc)
		if name == "" {
			continue
		}
		claim, err := dra.ResourceClaims().Get(pod.Namespace, name)
		if err != nil || claim.Status.Allocation != nil {
			continue
		}
		for _, r := range claim.Spec.Devices.Requests {
			e := r.Exactly
			if e == nil || e.AllocationMode == resourceapi.DeviceAllocationModeAll {
				continue
			}
			class, err := dra.DeviceClasses().Get(e.DeviceClassName)
			if err != nil || !TesseraClass(class) {
				continue
			}
			c := gpuinfo.ContainerRequest{Name: claim.Name + "/" + r.Name, Kind: gpuinfo.AppContainer, Count: int(max(e.Count, 1)), Cores: gpuinfo.FullCores}
			if e.Capacity != nil {
				if q, ok := capacityRequest(e.Capacity.Requests, gpuinfo.DRAMemory); ok {
					c.MemoryMiB = max(gpuinfo.MiB(q), 1)
				}
				if q, ok := capacityRequest(e.Capacity.Requests, gpuinfo.DRACores); ok {
					c.Cores = min(max(q.Value(), 0), gpuinfo.FullCores)
				}
			}
			req.Containers = append(req.Containers, c)
		}
	}
	if len(req.Containers) == 0 {
		return nil
	}
	return &req
}

// TesseraClass reports whether a DeviceClass hands out Tessera's cards: its
// configuration names Tessera's driver (the shipped classes do).
func TesseraClass(class *resourceapi.DeviceClass) bool {
	for _, c := range class.Spec.Config {
		if c.Opaque != nil && c.Opaque.Driver == gpuinfo.DRADriver {
			return true
		}
	}
	return false
}

// claimName is the name of the ResourceClaim a pod's claim entry refers to:
// its own, or the one made from its template; "" while that is not made.
func claimName(pod *v1.Pod, pc v1.PodResourceClaim) string {
	if pc.ResourceClaimName != nil {
		return *pc.ResourceClaimName
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == pc.Name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

// capacityRequest finds a capacity by its name, with or without the
// driver's domain.
func capacityRequest(requests map[resourceapi.QualifiedName]resource.Quantity, name string) (resource.Quantity, bool) {
	if q, ok := requests[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := requests[resourceapi.QualifiedName(gpuinfo.DRADriver+"/"+name)]
	return q, ok
}

// claimNodes reads the Tessera cards of the named nodes from the
// ResourceSlices, with what allocated claims consume of each.
func (p *Plugin) claimNodes(names sets.Set[string]) map[string]*claimNode {
	dra := p.handle.SharedDRAManager()
	slices, err := dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil
	}
	allocated, err := dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		return nil
	}
	nodes := map[string]*claimNode{}
	for _, slice := range slices {
		if slice.Spec.Driver != gpuinfo.DRADriver || slice.Spec.NodeName == nil || !names.Has(*slice.Spec.NodeName) {
			continue
		}
		n := nodes[*slice.Spec.NodeName]
		if n == nil {
			n = &claimNode{}
			nodes[*slice.Spec.NodeName] = n
		}
		for i := range slice.Spec.Devices {
			d := &slice.Spec.Devices[i]
			card, ok := cardOf(d)
			if !ok {
				continue
			}
			n.cards = append(n.cards, allocator.NewCards(&gpuinfo.Inventory{Cards: []gpuinfo.Card{card}})[0])
			id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, d.Name)
			use := allocator.Usage{}
			switch {
			case allocated.AllocatedDevices.Has(id):
				use = allocator.Usage{MemoryMiB: card.MemoryMiB, Cores: card.Cores}
			case allocated.AggregatedCapacity[id] != nil:
				if q := allocated.AggregatedCapacity[id][gpuinfo.DRAMemory]; q != nil {
					use.MemoryMiB = gpuinfo.MiB(*q)
				}
				if q := allocated.AggregatedCapacity[id][gpuinfo.DRACores]; q != nil {
					use.Cores = q.Value()
				}
			}
			n.used = append(n.used, use)
		}
	}
	return nodes
}

// cardOf reads a card from its ResourceSlice device; false for a device
// that is not one of the driver's cards.
func cardOf(d *resourceapi.Device) (gpuinfo.Card, bool) {
	index, ok := gpuinfo.DRACardIndex(d.Name)
	memory, hasMemory := d.Capacity[gpuinfo.DRAMemory]
	cores, hasCores := d.Capacity[gpuinfo.DRACores]
	if !ok || !hasMemory || !hasCores {
		return gpuinfo.Card{}, false
	}
	card := gpuinfo.Card{Index: index, MemoryMiB: gpuinfo.MiB(memory.Value), Cores: cores.Value.Value(), Healthy: true, NUMANode: -1}
	if a := d.Attributes["uuid"]; a.StringValue != nil {
		card.UUID = *a.StringValue
	}
	if a := d.Attributes["model"]; a.StringValue != nil {
		card.Model = *a.StringValue
	}
	if a := d.Attributes["migEnabled"]; a.BoolValue != nil {
		card.MIGEnabled = *a.BoolValue
	}
	for _, t := range d.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			card.Healthy = false
		}
	}
	return card, true
}

// claimScore scores a node for a pod with Tessera claims as Score does an
// extended-resource pod, and lowest where the policy finds no room.
func (p *Plugin) claimScore(c *claimState, nodeInfo fwk.NodeInfo) int64 {
	n := c.nodes[nodeInfo.Node().Name]
	if n == nil {
		return 0
	}
	out := allocator.Place(n.cards, n.used, nil, c.req, p.strategy(c.workload, nil, nodeInfo, c.cpuMilli), nil)
	switch {
	case !out.Fits && p.nodePolicy == allocator.FragmentationAware:
		return math.MinInt64
	case !out.Fits:
		return 0
	case p.nodePolicy == allocator.FragmentationAware:
		return fragmentationScore(out)
	}
	return usageScore(out)
}

// explainClaims says, for a pod with Tessera claims that no node could
// take, what its requests ask of a card against the most any card has or
// has free ("" for a pod without such claims).
func (p *Plugin) explainClaims(pod *v1.Pod, nodeInfos []fwk.NodeInfo) string {
	req := p.claimRequest(pod)
	if req == nil {
		return ""
	}
	names := sets.New[string]()
	for _, n := range nodeInfos {
		names.Insert(n.Node().Name)
	}
	var largest, most allocator.Usage
	cards := 0
	for _, n := range p.claimNodes(names) {
		for i, c := range n.cards {
			if !c.Healthy {
				continue
			}
			cards++
			largest.MemoryMiB = max(largest.MemoryMiB, c.Capacity.MemoryMiB)
			most.MemoryMiB = max(most.MemoryMiB, c.Capacity.MemoryMiB-n.used[i].MemoryMiB)
			most.Cores = max(most.Cores, c.Capacity.Cores-n.used[i].Cores)
		}
	}
	if cards == 0 {
		return "GPU claims: no node publishes Tessera cards in service (node agents with --dra)"
	}
	var b strings.Builder
	b.WriteString("GPU claims:")
	for i, c := range req.Containers {
		if i > 0 {
			b.WriteString(";")
		}
		memory := "a whole card's memory"
		if c.MemoryMiB > 0 {
			memory = strconv.FormatInt(c.MemoryMiB, 10) + " MiB"
		}
		fmt.Fprintf(&b, " %s asks %d card(s) with %s and %d %% of compute each", c.Name, c.Count, memory, c.Cores)
		if c.MemoryMiB > largest.MemoryMiB {
			fmt.Fprintf(&b, ", more memory than any Tessera card has (the largest: %d MiB)", largest.MemoryMiB)
		}
	}
	fmt.Fprintf(&b, "; the most free on any of the %d Tessera cards: %d MiB, %d %% of compute", cards, most.MemoryMiB, most.Cores)
	return b.String()
}
