package enforce

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// withClaim makes con0 of p use the pod's claim entry; claimName, when set,
// is the ResourceClaim the entry names.
func withClaim(p *v1.Pod, entry, claimName string) *v1.Pod {
	p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: entry})
	if claimName != "" {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: entry, ResourceClaimName: ptr.To(claimName)})
	}
	return p
}

// claimBuilder builds a ResourceClaim in namespace ns.
type claimBuilder struct{ c *resourceapi.ResourceClaim }

func makeClaim(name string) claimBuilder {
	return claimBuilder{&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("cuid-" + name)}}}
}

// result allocates device of driver in pool, consuming memory and cores
// when given ("" for none).
func (b claimBuilder) result(driver, pool, device, memory, cores string) claimBuilder {
	if b.c.Status.Allocation == nil {
		b.c.Status.Allocation = &resourceapi.AllocationResult{}
	}
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: pool, Device: device}
	if memory != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			gpuinfo.DRAMemory: resource.MustParse(memory), gpuinfo.DRACores: resource.MustParse(cores),
		}
	}
	b.c.Status.Allocation.Devices.Results = append(b.c.Status.Allocation.Devices.Results, r)
	return b
}

func (b claimBuilder) reservedFor(pod string, uid types.UID) claimBuilder {
	b.c.Status.ReservedFor = append(b.c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod, UID: uid})
	return b
}

// claimMap reads claims from a fixed set.
func claimMap(claims ...claimBuilder) ClaimGetter {
	return func(namespace, name string) (*resourceapi.ResourceClaim, error) {
		for _, c := range claims {
			if c.c.Namespace == namespace && c.c.Name == name {
				return c.c, nil
			}
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
}

// TestForClaims: a container without an assignment is left to its claims
// only when one is Tessera's, allocated in this node's pool and reserved
// for this very pod; any other claim leaves it with no card.
func TestForClaims(t *testing.T) {
	tessera := func(name string) claimBuilder {
		return makeClaim(name).result(gpuinfo.DRADriver, "node-1", "gpu-2", "4Gi", "30").reservedFor("p", "uid-1")
	}
	heldCard2 := &Adjustment{Holdings: []Holding{{Key: "claim/cuid-c1", Cards: []gpuinfo.CardAssignment{{Index: 2, UUID: "GPU-2", MemoryMiB: 4096, Cores: 30}}}}}
	templated := withClaim(pod(nil, ""), "gpu", "")
	templated.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}
	generated := templated.DeepCopy()
	generated.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("c1")}}
	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		uid     types.UID
		claims  []claimBuilder
		want    *Adjustment
		wantErr string
	}{
		{
			name:   "a Tessera claim allocated here and reserved for the pod",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			claims: []claimBuilder{tessera("c1")},
			want:   heldCard2,
		},
		{
			name:   "a Tessera claim from a template, named in the pod's status",
			pod:    generated,
			claims: []claimBuilder{tessera("c1")},
			want:   heldCard2,
		},
		{
			name:    "a template claim the status does not name yet: kubelet retries",
			pod:     templated,
			claims:  []claimBuilder{tessera("c1")},
			wantErr: "does not name the claim generated for it yet (kubelet will retry)",
		},
		{
			name:   "another driver's claim opens no card",
			pod:    withClaim(pod(nil, ""), "nic", "c1"),
			claims: []claimBuilder{makeClaim("c1").result("nic.example.com", "node-1", "eth1", "", "").reservedFor("p", "uid-1")},
			want:   NoGPU(),
		},
		{
			name:   "a claim that is not allocated opens no card",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			claims: []claimBuilder{makeClaim("c1").reservedFor("p", "uid-1")},
			want:   NoGPU(),
		},
		{
			name:   "a Tessera claim allocated on another node opens no card",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			claims: []claimBuilder{makeClaim("c1").result(gpuinfo.DRADriver, "node-2", "gpu-2", "4Gi", "30").reservedFor("p", "uid-1")},
			want:   NoGPU(),
		},
		{
			name:   "a Tessera claim reserved for another pod opens no card",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			claims: []claimBuilder{makeClaim("c1").result(gpuinfo.DRADriver, "node-1", "gpu-2", "4Gi", "30").reservedFor("other", "uid-9")},
			want:   NoGPU(),
		},
		{
			name:   "nor one reserved for the pod's name under another UID",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			uid:    "uid-2",
			claims: []claimBuilder{tessera("c1")},
			want:   NoGPU(),
		},
		{
			name:    "a claim that cannot be found: kubelet retries",
			pod:     withClaim(pod(nil, ""), "gpu", "c1"),
			wantErr: "resource claim ns/c1 not found (kubelet will retry)",
		},
		{
			name:    "a Tessera claim naming a card this node does not have",
			pod:     withClaim(pod(nil, ""), "gpu", "c1"),
			claims:  []claimBuilder{makeClaim("c1").result(gpuinfo.DRADriver, "node-1", "gpu-9", "4Gi", "30").reservedFor("p", "uid-1")},
			wantErr: "device gpu-9 is not a card of node node-1",
		},
		{
			name:   "a foreign claim beside a Tessera claim: only Tessera's cards",
			pod:    withClaim(withClaim(pod(nil, ""), "nic", "n1"), "gpu", "c1"),
			claims: []claimBuilder{makeClaim("n1").result("nic.example.com", "node-1", "eth1", "", "").reservedFor("p", "uid-1"), tessera("c1")},
			want:   heldCard2,
		},
		{
			name:   "a whole-card Tessera claim holds the whole card",
			pod:    withClaim(pod(nil, ""), "gpu", "c1"),
			claims: []claimBuilder{makeClaim("c1").result(gpuinfo.DRADriver, "node-1", "gpu-2", "", "").reservedFor("p", "uid-1")},
			want:   &Adjustment{Holdings: []Holding{{Key: "claim/cuid-c1", Cards: []gpuinfo.CardAssignment{{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Cores: 100}}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := types.UID("uid-1")
			if tc.uid != "" {
				uid = tc.uid
			}
			node := testNode()
			node.Claims = claimMap(tc.claims...)
			got, err := DefaultConfig().For(tc.pod, uid, "con0", "ctr-1", node)
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("adjustment (-want,+got):\n%s", diff)
			}
		})
	}
}
