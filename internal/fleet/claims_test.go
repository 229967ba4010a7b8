package fleet

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// device is a card as the node agent's DRA driver publishes it.
func device(index int, uuid string, memory string) resourceapi.Device {
	return resourceapi.Device{
		Name:       "gpu-" + string(rune('0'+index)),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(uuid)}, "model": {StringValue: ptr.To("NVIDIA L4")}},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: resource.MustParse(memory)}, "cores": {Value: resource.MustParse("100")},
		},
	}
}

// TestAddClaims: DRA nodes appear with their cards in index order, charged
// with what allocated claims consume (a result without consumed capacity
// holds the whole card), held by the pods the claims are reserved for;
// other drivers' slices and results, unallocated claims and nodes served
// through the inventory annotation are left as they are.
func TestAddClaims(t *testing.T) {
	s := Build([]v1.Node{node("ext", inventory)}, nil)
	slices := []resourceapi.ResourceSlice{
		{Spec: resourceapi.ResourceSliceSpec{Driver: "tessera.io", NodeName: ptr.To("dra"), Pool: resourceapi.ResourcePool{Name: "dra"},
			Devices: []resourceapi.Device{device(1, "GPU-y", "23034Mi"), device(0, "GPU-x", "23034Mi")}}},
		{Spec: resourceapi.ResourceSliceSpec{Driver: "other.example.com", NodeName: ptr.To("dra"), Pool: resourceapi.ResourcePool{Name: "dra"},
			Devices: []resourceapi.Device{{Name: "nic-0"}}}},
		{Spec: resourceapi.ResourceSliceSpec{Driver: "tessera.io", NodeName: ptr.To("ext"), Pool: resourceapi.ResourcePool{Name: "ext"},
			Devices: []resourceapi.Device{device(0, "GPU-z", "15360Mi")}}},
	}
	claim := func(name string, results []resourceapi.DeviceRequestAllocationResult, pods ...string) resourceapi.ResourceClaim {
		c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if results != nil {
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
		}
		for _, p := range pods {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p})
		}
		return c
	}
	share := func(device, memory, cores string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Driver: "tessera.io", Pool: "dra", Device: device, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "cores": resource.MustParse(cores)}}
	}
	claims := []resourceapi.ResourceClaim{
		claim("a", []resourceapi.DeviceRequestAllocationResult{share("gpu-0", "6Gi", "20")}, "p1", "p2"),
		claim("b", []resourceapi.DeviceRequestAllocationResult{share("gpu-0", "2Gi", "30"), {Driver: "other.example.com", Pool: "dra", Device: "nic-0"}}, "p3"),
		claim("whole", []resourceapi.DeviceRequestAllocationResult{{Driver: "tessera.io", Pool: "dra", Device: "gpu-1"}}),
		claim("pending", nil, "p4"),
	}
	s.AddClaims(slices, claims)

	type card struct {
		Index   int
		UUID    string
		Used    allocator.Usage
		Holders []PodRef
	}
	got := map[string][]card{}
	for _, n := range s.Nodes {
		for i, c := range n.Cards {
			got[n.Name] = append(got[n.Name], card{c.Index, c.UUID, n.Used[i], n.Holders[i]})
		}
		if n.Name == "dra" && !n.Claims || n.Name == "ext" && n.Claims {
			t.Errorf("node %s: Claims = %v", n.Name, n.Claims)
		}
	}
	want := map[string][]card{
		"dra": {
			{0, "GPU-x", allocator.Usage{MemoryMiB: 8192, Cores: 50}, []PodRef{{"ns", "p1"}, {"ns", "p2"}, {"ns", "p3"}}},
			{1, "GPU-y", allocator.Usage{MemoryMiB: 23034, Cores: 100}, nil},
		},
		"ext": {
			{0, "GPU-a", allocator.Usage{}, nil},
			{1, "GPU-b", allocator.Usage{}, nil},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cards (-want,+got):\n%s", diff)
	}
}
