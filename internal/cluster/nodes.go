package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/dra"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
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

// SimulatedInventory is the inventory the node agent's simulated backend
// reports for count cards of one kind on node.
func SimulatedInventory(node string, spec CardSpec, count int) (*gpuinfo.Inventory, error) {
	backend, err := discovery.NewSimulated(node, fmt.Sprintf("%dx%s", count, spec))
	if err != nil {
		return nil, err
	}
	cards, err := backend.Cards()
	return discovery.Inventory(cards, gpuinfo.InventoryVersion), err
}

// AddSimulatedNode creates a node and runs the node agent's discovery and
// publishing for it once, with the simulated backend and under the agent's
// identity for that node: the node's inventory and heartbeat come from the
// same code, and pass the same admission policies, as on a real node. The
// returned agent keeps the heartbeat going when Run.
func (cp *ControlPlane) AddSimulatedNode(ctx context.Context, name string, spec CardSpec, count int, labels map[string]string) (*agent.Agent, error) {
	node := NewNode(name, labels)
	AdvertiseGPUs(node, count)
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	backend, err := discovery.NewSimulated(name, fmt.Sprintf("%dx%s", count, spec))
	if err != nil {
		return nil, err
	}
	client, err := cp.AgentClient(name)
	if err != nil {
		return nil, err
	}
	a := &agent.Agent{
		Backend:           backend,
		Publisher:         &publish.Publisher{Client: client, NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second},
		RescanInterval:    30 * time.Second,
		HeartbeatInterval: 10 * time.Second,
	}
	if err := serveSlices(ctx, a, backend, client, name); err != nil {
		return nil, err
	}
	return a, a.Once(ctx)
}

// serveSlices makes the agent cut the node's dynamic cards, if it has any,
// as the node agent's --dynamic-mig-cards does, watching the node's pods as
// the agent's identity.
func serveSlices(ctx context.Context, a *agent.Agent, backend *discovery.Simulated, client kubernetes.Interface, node string) error {
	cards, err := backend.Cards()
	if err != nil || !slices.ContainsFunc(cards, func(c discovery.Card) bool { return c.MIGDynamic }) {
		return err
	}
	m := a.ServeSlices(ctx, backend)
	pods, err := nri.PodsOnNode(ctx, client, node, m.PodChanged)
	if err != nil {
		return err
	}
	m.SetPods(func() ([]*v1.Pod, error) { return pods.List(labels.Everything()) })
	return nil
}

// AddDRANode creates a node whose agent serves its cards through the DRA
// driver (the agent's --dra), under the agent's identity: it starts the
// driver, with its kubelet socket and CDI specs under dir, and publishes
// once, so the node's ResourceSlice is written. The returned agent keeps
// the heartbeat going when Run; the driver stops with ctx.
func (cp *ControlPlane) AddDRANode(ctx context.Context, name string, spec CardSpec, count int, dir string) (*agent.Agent, *dra.Driver, error) {
	return cp.AddDRANodeOf(ctx, name, fmt.Sprintf("%dx%s", count, spec), dir)
}

// AddDRANodeOf is AddDRANode with the cards of a simulated backend's spec
// (discovery.Simulated), MIG slices included: the driver makes and unmakes
// the slices of dynamic cards.
func (cp *ControlPlane) AddDRANodeOf(ctx context.Context, name, gpus, dir string) (*agent.Agent, *dra.Driver, error) {
	if _, err := CreateNode(ctx, cp.Client, name, nil); err != nil {
		return nil, nil, err
	}
	backend, err := discovery.NewSimulated(name, gpus)
	if err != nil {
		return nil, nil, err
	}
	client, err := cp.AgentClient(name)
	if err != nil {
		return nil, nil, err
	}
	// kubelet's registration directory, which kubelet would have made.
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o750); err != nil {
		return nil, nil, err
	}
	// The claims' shared regions go under dir, not the host's cache.
	enforcement := enforce.DefaultConfig()
	enforcement.Paths.HostCacheDir = filepath.Join(dir, "vgpu-cache")
	if err := os.MkdirAll(enforcement.Paths.HostCacheDir, 0o755); err != nil {
		return nil, nil, err
	}
	driver := &dra.Driver{Node: name, Enforce: enforcement, CDIDir: filepath.Join(dir, "cdi"), MIG: backend}
	if err := driver.Start(ctx, client, dra.Options{PluginDataDir: filepath.Join(dir, "plugin"), RegistrarDir: filepath.Join(dir, "registry")}); err != nil {
		return nil, nil, err
	}
	a := &agent.Agent{
		Backend:           backend,
		Devices:           []agent.CardWatcher{driver},
		Publisher:         &publish.Publisher{Client: client, NodeName: name, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second, WithoutInventory: true},
		RescanInterval:    30 * time.Second,
		HeartbeatInterval: 10 * time.Second,
	}
	return a, driver, a.Once(ctx)
}

// PublishInventory sets the node's inventory annotation to raw, as the node's
// agent, and renews its heartbeat Lease once, as the agent does: tests use it
// for inventories the agent's code would not write.
func (cp *ControlPlane) PublishInventory(ctx context.Context, node, raw string) error {
	client, err := cp.AgentClient(node)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{gpuinfo.InventoryAnnotation: raw}}})
	if err != nil {
		return err
	}
	if _, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	publisher := &publish.Publisher{Client: client, NodeName: node, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
	return publisher.Heartbeat(ctx)
}

// AdvertiseGPUs sets the card-count resource in the node's capacity, as the
// node agent's device plugin makes kubelet advertise it for cards cards.
func AdvertiseGPUs(node *v1.Node, cards int) {
	units := *resource.NewQuantity(int64(cards*gpuinfo.DefaultSplitCount), resource.DecimalSI)
	node.Status.Capacity[gpuinfo.DefaultResourceNames().GPU] = units
	node.Status.Allocatable[gpuinfo.DefaultResourceNames().GPU] = units
}

// CreateNode creates NewNode(name, labels).
func CreateNode(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string) (*v1.Node, error) {
	return client.CoreV1().Nodes().Create(ctx, NewNode(name, labels), metav1.CreateOptions{})
}

// NewNode is a Ready node with 64 CPUs, 512 GiB and 110 pods allocatable and
// the given labels. It has no GPU inventory: only its agent may publish one.
func NewNode(name string, labels map[string]string) *v1.Node {
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
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity.DeepCopy()
	return node
}
