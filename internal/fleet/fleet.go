// Package fleet reads, from the Kubernetes API alone, what Tessera's
// scheduler knows about the cluster's GPUs: every node's cards from its
// inventory annotation and each card's usage from the assignments of the
// pods bound there, charged by the scheduler's own allocator. The demo's
// table and the kubectl plugin both use it, so they show what the scheduler
// sees.
package fleet

import (
	"context"
	"fmt"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// PodRef names a pod.
type PodRef struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// Node is one GPU node: a node carrying an inventory annotation, or one
// whose agent publishes its cards as DRA devices.
type Node struct {
	// Name is the node's name.
	Name string
	// Labels are the node object's labels (none for a node known only from
	// its ResourceSlices).
	Labels map[string]string
	// Claims is set for a node whose cards are DRA devices, held by claims.
	Claims bool
	// Err is why the node's inventory annotation is invalid; such a node
	// offers no GPUs (Cards is empty), as for the scheduler.
	Err error
	// Cards are the node's cards, sorted by index.
	Cards []allocator.Card
	// Used is what the pods bound to the node hold on each card, parallel
	// to Cards.
	Used []allocator.Usage
	// Holders are the pods holding each card, parallel to Cards, in the
	// order the pods were listed.
	Holders [][]PodRef
}

// Snapshot is the cluster's GPUs as the API shows them at one moment.
type Snapshot struct {
	// Nodes are the GPU nodes, sorted by name.
	Nodes []*Node
	// Pods are all the pods listed, in every namespace.
	Pods []v1.Pod
	// Problems are the invalid inventory and assignment annotations found,
	// each error naming the object and the field at fault. The objects are
	// treated as the scheduler treats them: a node with an invalid inventory
	// offers no GPUs, a pod with an invalid assignment is not charged.
	Problems []error
}

// Load lists the nodes and pods of the cluster and builds their Snapshot.
func Load(ctx context.Context, client kubernetes.Interface) (*Snapshot, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	s := Build(nodes.Items, pods.Items)
	// Cards served as DRA devices: a cluster without the API, or a user
	// who may not list it, simply has none to show.
	resourceSlices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			s.Problems = append(s.Problems, fmt.Errorf("listing ResourceSlices: %w", err))
		}
		return s, nil
	}
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			s.Problems = append(s.Problems, fmt.Errorf("listing ResourceClaims: %w", err))
		}
		return s, nil
	}
	s.AddClaims(resourceSlices.Items, claims.Items)
	return s, nil
}

// AddClaims adds the nodes whose cards Tessera's DRA driver publishes in
// slices, charged with what the allocated claims consume of each card; a
// card's holders are the pods its claims are reserved for.
func (s *Snapshot) AddClaims(resourceSlices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) {
	byName := map[string]*Node{}
	for i := range resourceSlices {
		spec := &resourceSlices[i].Spec
		if spec.Driver != gpuinfo.DRADriver || spec.NodeName == nil || s.Node(*spec.NodeName) != nil && byName[*spec.NodeName] == nil {
			continue
		}
		node := byName[*spec.NodeName]
		if node == nil {
			node = &Node{Name: *spec.NodeName, Claims: true}
			byName[node.Name] = node
			s.Nodes = append(s.Nodes, node)
		}
		for j := range spec.Devices {
			if card, ok := gpuinfo.DRACard(&spec.Devices[j]); ok {
				node.Cards = append(node.Cards, allocator.NewCard(card))
				node.Used = append(node.Used, allocator.Usage{})
				node.Holders = append(node.Holders, nil)
			}
		}
	}
	for _, n := range byName {
		sort.Stable(byIndex{n})
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			node := byName[r.Pool]
			index, ok := gpuinfo.DRACardIndex(r.Device)
			if r.Driver != gpuinfo.DRADriver || node == nil || !ok {
				continue
			}
			pos := slices.IndexFunc(node.Cards, func(card allocator.Card) bool { return card.Index == index })
			if pos < 0 {
				continue
			}
			memory, cores := gpuinfo.DRAShare(r.ConsumedCapacity, gpuinfo.Card{MemoryMiB: node.Cards[pos].Capacity.MemoryMiB})
			node.Used[pos].MemoryMiB += memory
			node.Used[pos].Cores += cores
			for _, ref := range c.Status.ReservedFor {
				pod := PodRef{Namespace: c.Namespace, Name: ref.Name}
				if ref.Resource == "pods" && !holds(node.Holders[pos], pod) {
					node.Holders[pos] = append(node.Holders[pos], pod)
				}
			}
		}
	}
}

// byIndex sorts a node's cards, with their usage and holders, by index,
// stably: a card's MIG slices stay after it.
type byIndex struct{ *Node }

func (b byIndex) Len() int           { return len(b.Cards) }
func (b byIndex) Less(i, j int) bool { return b.Cards[i].Index < b.Cards[j].Index }
func (b byIndex) Swap(i, j int) {
	b.Cards[i], b.Cards[j] = b.Cards[j], b.Cards[i]
	b.Used[i], b.Used[j] = b.Used[j], b.Used[i]
	b.Holders[i], b.Holders[j] = b.Holders[j], b.Holders[i]
}

// Build computes the Snapshot of the given nodes and pods. Pods are charged
// as the scheduler charges them: those bound to a node and not finished, by
// their assignment annotation, with allocator.Charge.
func Build(nodes []v1.Node, pods []v1.Pod) *Snapshot {
	s := &Snapshot{Pods: pods}
	byName := map[string]*Node{}
	for i := range nodes {
		n := &nodes[i]
		raw, ok := n.Annotations[gpuinfo.InventoryAnnotation]
		if !ok {
			continue
		}
		node := &Node{Name: n.Name, Labels: n.Labels}
		inv, err := gpuinfo.DecodeInventory(raw)
		if err != nil {
			node.Err = err
			s.Problems = append(s.Problems, fmt.Errorf("node %s: %w", n.Name, err))
		} else {
			node.Cards = allocator.NewCards(inv)
		}
		node.Used = make([]allocator.Usage, len(node.Cards))
		node.Holders = make([][]PodRef, len(node.Cards))
		byName[n.Name] = node
		s.Nodes = append(s.Nodes, node)
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	for i := range pods {
		p := &pods[i]
		if !Charged(p) {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(p.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			s.Problems = append(s.Problems, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		node := byName[p.Spec.NodeName]
		if node == nil || len(node.Cards) == 0 {
			continue
		}
		charge := allocator.Charge(node.Cards, gpuinfo.ContainerOrder(p), a)
		ref := PodRef{Namespace: p.Namespace, Name: p.Name}
		for c := range charge {
			node.Used[c].MemoryMiB += charge[c].MemoryMiB
			node.Used[c].Cores += charge[c].Cores
		}
		for _, entries := range a.Containers {
			for _, e := range entries {
				if c := cardPosition(node.Cards, e.Key()); c >= 0 && !holds(node.Holders[c], ref) {
					node.Holders[c] = append(node.Holders[c], ref)
				}
			}
		}
	}
	// Assignments are maps: list each card's holders in a stable order.
	order := map[PodRef]int{}
	for i := range pods {
		order[PodRef{Namespace: pods[i].Namespace, Name: pods[i].Name}] = i
	}
	for _, n := range s.Nodes {
		for _, h := range n.Holders {
			sort.Slice(h, func(i, j int) bool { return order[h[i]] < order[h[j]] })
		}
	}
	return s
}

// Model is the card's model as tables show it: marked "(DRA)" on a node
// whose cards are DRA devices.
func (n *Node) Model(c allocator.Card) string {
	if n.Claims {
		return c.Model + " (DRA)"
	}
	return c.Model
}

// Node returns the GPU node named name, or nil.
func (s *Snapshot) Node(name string) *Node {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Charged reports whether the scheduler charges the pod's cards: it is bound
// to a node, carries an assignment and has not finished.
func Charged(p *v1.Pod) bool {
	_, ok := p.Annotations[gpuinfo.AssignmentAnnotation]
	return ok && p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed
}

func cardPosition(cards []allocator.Card, uuid string) int {
	for i := range cards {
		if cards[i].UUID == uuid {
			return i
		}
	}
	return -1
}

func holds(refs []PodRef, ref PodRef) bool {
	for _, r := range refs {
		if r == ref {
			return true
		}
	}
	return false
}
