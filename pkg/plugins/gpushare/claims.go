package gpushare

import (
	"fmt"
	"math"
	"slices"
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
	// inventory holds the cards as read from their devices and domains
	// their NVLink domains (parallel to cards), for the links.
	inventory []gpuinfo.Card
	domains   []int64
}

// link gives the node's cards the links their devices' topology attributes
// tell (gpuinfo.DRALink).
func (n *claimNode) link() {
	indices := make([]int, len(n.cards))
	for i := range n.cards {
		indices[i] = n.cards[i].Index
	}
	links := allocator.LinksBetween(indices, func(i, j int) gpuinfo.LinkClass {
		return gpuinfo.DRALink(n.domains[i], n.domains[j], &n.inventory[i], &n.inventory[j])
	})
	for i := range n.cards {
		n.cards[i].Links = links
	}
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
	c := &claimState{req: req, nodes: p.claimNodes(nodes)}
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
			if err != nil || !tesseraClass(class) {
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

// tesseraClass reports whether a DeviceClass hands out Tessera's cards: its
// configuration names Tessera's driver (the shipped classes do).
func tesseraClass(class *resourceapi.DeviceClass) bool {
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

// nodeNames are the names of the nodes.
func nodeNames(nodes []fwk.NodeInfo) sets.Set[string] {
	names := sets.New[string]()
	for _, n := range nodes {
		names.Insert(n.Node().Name)
	}
	return names
}

// claimNodes reads the Tessera cards of the given nodes from the
// ResourceSlices, with what allocated claims consume of each; nil when
// none of them has any (the claims are then not read). A cluster without
// Tessera's DRA devices pays one list of its slices.
func (p *Plugin) claimNodes(nodeInfos []fwk.NodeInfo) map[string]*claimNode {
	dra := p.handle.SharedDRAManager()
	if dra == nil {
		return nil
	}
	resourceSlices, err := dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil || !slices.ContainsFunc(resourceSlices, func(s *resourceapi.ResourceSlice) bool { return s.Spec.Driver == gpuinfo.DRADriver }) {
		return nil
	}
	names := nodeNames(nodeInfos)
	nodes := map[string]*claimNode{}
	// Each card's device, for its usage once the claims are read.
	type cardRef struct {
		node *claimNode
		pos  int
		id   structured.DeviceID
	}
	var refs []cardRef
	for _, slice := range resourceSlices {
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
			if card, ok := gpuinfo.DRACard(d); ok {
				refs = append(refs, cardRef{n, len(n.cards), structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, d.Name)})
				n.cards = append(n.cards, allocator.NewCard(card))
				n.used = append(n.used, allocator.Usage{})
				n.inventory = append(n.inventory, card)
				n.domains = append(n.domains, gpuinfo.DRANVLinkDomain(d))
			}
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	for _, n := range nodes {
		n.link()
	}
	allocated, err := dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		return nil
	}
	for _, r := range refs {
		used := &r.node.used[r.pos]
		switch consumed := allocated.AggregatedCapacity[r.id]; {
		case allocated.AllocatedDevices.Has(r.id):
			*used = r.node.cards[r.pos].Capacity
		case consumed != nil:
			if q := consumed[gpuinfo.DRAMemory]; q != nil {
				used.MemoryMiB = gpuinfo.MiB(*q)
			}
			if q := consumed[gpuinfo.DRACores]; q != nil {
				used.Cores = q.Value()
			}
		}
	}
	return nodes
}

// claimScore scores a node for a pod with Tessera claims as Score does an
// extended-resource pod, and lowest (after NormalizeScore) where the policy
// finds no room or the node has no Tessera cards.
func (p *Plugin) claimScore(c *claimState, nodeInfo fwk.NodeInfo) int64 {
	n := c.nodes[nodeInfo.Node().Name]
	var out allocator.Outcome
	if n != nil {
		out = allocator.Place(n.cards, n.used, nil, c.req, p.strategy(c.workload, nil, nodeInfo, c.cpuMilli), nil)
	}
	switch {
	case out.Fits && p.nodePolicy == allocator.FragmentationAware:
		return p.linkedScore(out, fragmentationScore(out))
	case out.Fits:
		return p.linkedScore(out, usageScore(out))
	case p.nodePolicy == allocator.FragmentationAware:
		return math.MinInt64
	case p.nodePolicy == allocator.Spread: // reversed by NormalizeScore
		return fwk.MaxNodeScore
	}
	return 0
}

// explainClaims says, for a pod with Tessera claims that no node could
// take, what its requests ask of a card against the most any card has or
// has free ("" for a pod without such claims).
func (p *Plugin) explainClaims(pod *v1.Pod, nodeInfos []fwk.NodeInfo) string {
	req := p.claimRequest(pod)
	if req == nil {
		return ""
	}
	var largest, most allocator.Usage
	cards := 0
	for _, n := range p.claimNodes(nodeInfos) {
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
