package cluster

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// CardSpec is a kind of simulated card, in the node agent's notation.
type CardSpec string

// Common card kinds.
const (
	A100 CardSpec = "A100-80GB"
	H100 CardSpec = "H100-80GB"
	T4   CardSpec = "T4-16GB"
	L4   CardSpec = "L4-24GB"
)

// AgentNamespace is where simulated nodes' agents keep their heartbeat Leases.
const AgentNamespace = "tessera-system"

// SimulatedInventory is the inventory the node agent's simulated backend
// reports for count cards of one kind on node.
func SimulatedInventory(node string, spec CardSpec, count int) (*gpuinfo.Inventory, error) {
	backend, err := discovery.NewSimulated(node, fmt.Sprintf("%dx%s", count, spec))
	if err != nil {
		return nil, err
	}
	cards, err := backend.Cards()
	return discovery.Inventory(cards), err
}

// AddSimulatedNode creates a node and runs the node agent's discovery and
// publishing for it once, with the simulated backend: the node's inventory
// and heartbeat come from the same code as on a real node. The returned
// agent keeps the heartbeat going when Run.
func AddSimulatedNode(ctx context.Context, client kubernetes.Interface, name string, spec CardSpec, count int, labels map[string]string) (*agent.Agent, error) {
	if _, err := CreateGPUNode(ctx, client, name, nil, labels); err != nil {
		return nil, err
	}
	backend, err := discovery.NewSimulated(name, fmt.Sprintf("%dx%s", count, spec))
	if err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, client, AgentNamespace); err != nil {
		return nil, err
	}
	a := &agent.Agent{
		Backend:           backend,
		Publisher:         &publish.Publisher{Client: client, NodeName: name, Namespace: AgentNamespace, LeaseDuration: 40 * time.Second},
		RescanInterval:    30 * time.Second,
		HeartbeatInterval: 10 * time.Second,
	}
	return a, a.Once(ctx)
}

func ensureNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// CreateGPUNode creates NewGPUNode(name, inv, labels). Tests use it for
// inventories no agent would write.
func CreateGPUNode(ctx context.Context, client kubernetes.Interface, name string, inv *gpuinfo.Inventory, labels map[string]string) (*v1.Node, error) {
	node, err := NewGPUNode(name, inv, labels)
	if err != nil {
		return nil, err
	}
	return client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
}

// NewGPUNode is a Ready node with 64 CPUs, 512 GiB and 110 pods allocatable,
// the given labels, and the inventory annotation (none when inv is nil).
func NewGPUNode(name string, inv *gpuinfo.Inventory, labels map[string]string) (*v1.Node, error) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "Simulated"}},
		},
	}
	for k, v := range labels {
		node.Labels[k] = v
	}
	capacity := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("512Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	if inv != nil {
		raw, err := inv.Encode()
		if err != nil {
			return nil, err
		}
		node.Annotations = map[string]string{gpuinfo.InventoryAnnotation: raw}
	}
	return node, nil
}
