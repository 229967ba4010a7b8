package cluster

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// CardSpec describes a kind of card for a simulated node.
type CardSpec struct {
	Model     string
	MemoryMiB int64
}

// Common card kinds.
var (
	A100 = CardSpec{"NVIDIA A100-SXM4-80GB", 81920}
	H100 = CardSpec{"NVIDIA H100 80GB HBM3", 81920}
	T4   = CardSpec{"Tesla T4", 15360}
	L4   = CardSpec{"NVIDIA L4", 23034}
)

// SimulatedInventory returns the inventory of a node with count healthy cards
// of one kind; UUIDs are derived from the node name, so they are stable.
func SimulatedInventory(node string, spec CardSpec, count int) *gpuinfo.Inventory {
	inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion}
	for i := 0; i < count; i++ {
		inv.Cards = append(inv.Cards, gpuinfo.Card{
			Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: spec.Model, MemoryMiB: spec.MemoryMiB,
			Cores: gpuinfo.FullCores, NUMANode: i * 2 / count, Healthy: true,
		})
	}
	return inv
}

// CreateGPUNode creates a Ready node with 64 CPUs, 512 GiB and 110 pods
// allocatable, the given labels, and the inventory annotation (none when inv
// is nil).
func CreateGPUNode(ctx context.Context, client kubernetes.Interface, name string, inv *gpuinfo.Inventory, labels map[string]string) (*v1.Node, error) {
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
	return client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
}

// ModelLabel is a short label value for a card model, e.g. "a100".
func ModelLabel(spec CardSpec) string {
	for _, short := range []string{"A100", "H100", "T4", "L4"} {
		if strings.Contains(spec.Model, short) {
			return strings.ToLower(short)
		}
	}
	return "gpu"
}
