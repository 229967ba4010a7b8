package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// TestTopologyNVLinkQuads: on a node of two NVLink quads, published by the
// agent's code with its links (inventory version 2), the real scheduler
// gives a 4-card pod that requires NVLink a whole quad; while a card of each
// quad is held it stays Pending saying no four linked cards are free, and
// it binds to the quad whose card is freed.
func TestTopologyNVLinkQuads(t *testing.T) {
	e := newEnv(t)
	quads := e.node("quads", cluster.H100+",topology="+topology.NVLinkQuads, 8, nil)
	e.startScheduler()
	holder := func(name string, card int) *v1.Pod {
		pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu": 1})
		pod.Annotations = map[string]string{gpuinfo.UUIDAnnotation: fmt.Sprintf("GPU-sim-%s-%d", quads, card)}
		return pod
	}
	fourLinked := func(name string) *v1.Pod {
		pod := e.podSpec(name, "tessera-binpack", map[string]int64{"tessera.io/gpu": 4})
		pod.Annotations = map[string]string{gpuinfo.TopologyAnnotation: "nvlink"}
		return pod
	}
	cards := func(pod *v1.Pod) []int {
		var idx []int
		for _, c := range assignment(t, pod).Containers["main"] {
			idx = append(idx, c.Index)
		}
		return idx
	}
	oneQuad := func(idx []int) bool {
		for _, i := range idx {
			if i/4 != idx[0]/4 {
				return false
			}
		}
		return len(idx) == 4
	}

	e.create(holder("holds-1", 1))
	e.waitBound(30*time.Second, "holds-1")
	e.create(fourLinked("first"))
	if got := cards(e.waitBound(30*time.Second, "first")["first"]); !oneQuad(got) || got[0] != 4 {
		t.Errorf("the first 4-card pod got cards %v, want the free quad 4-7", got)
	}
	e.deletePod("first")
	e.create(holder("holds-5", 5))
	e.waitBound(30*time.Second, "holds-5")
	e.create(fourLinked("second"))
	if msg := e.waitUnschedulable("second"); !strings.Contains(msg, "no 4 free GPUs linked by nvlink") ||
		!strings.Contains(msg, "1 node with no 4 GPUs with room linked by nvlink") {
		t.Errorf("pending message %q does not say that no four linked cards are free", msg)
	}
	e.deletePod("holds-5")
	if got := cards(e.waitBound(30*time.Second, "second")["second"]); !oneQuad(got) || got[0] != 4 {
		t.Errorf("the second 4-card pod got cards %v, want the freed quad 4-7", got)
	}
	// A tenant's misspelt requirement is an invalid request, named.
	typo := fourLinked("typo")
	typo.Annotations[gpuinfo.TopologyAnnotation] = "NVLINK"
	e.create(typo)
	if msg := e.waitUnschedulable("typo"); !strings.Contains(msg, `annotation tessera.io/gpu-topology: must be "nvlink"`) {
		t.Errorf("pending message %q does not name the invalid annotation", msg)
	}
	e.checkNoOvercommit(t)
}

// TestClaimsPreferLinkedCards: a pod whose claim asks for four whole cards
// goes, under binpack, to the node of two NVLink quads where a quad is free
// rather than to the fuller one where no quad is, the topology read from
// the devices' attributes the agent's DRA driver publishes.
func TestClaimsPreferLinkedCards(t *testing.T) {
	e := newEnv(t)
	spec := "8x" + string(cluster.H100) + ",topology=" + topology.NVLinkQuads
	linked, fuller := e.ns+"-linked", e.ns+"-fuller"
	for _, name := range []string{linked, fuller} {
		a, _, err := controlPlane.AddDRANodeOf(e.tCtx, name, spec, e.tCtx.TempDir())
		e.nodes = append(e.nodes, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Once(e.tCtx); err != nil {
			t.Fatal(err)
		}
		e.tCtx.Cleanup(func() {
			_ = e.client.ResourceV1().ResourceSlices().DeleteCollection(e.tCtx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
		})
	}
	e.startScheduler()
	claimPodOn := func(name, node string) {
		pod := e.podSpec(name, "tessera-binpack", nil)
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
		pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		if node != "" {
			pod.Spec.NodeSelector = map[string]string{v1.LabelHostname: node}
		}
		e.create(pod)
	}
	hold := func(name, node string, card int) {
		e.createClaim(name, "gpu", &resourceapi.ExactDeviceRequest{
			DeviceClassName: "gpu.tessera.io",
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes["%s"].index == %d`, gpuinfo.DRADriver, card),
			}}},
		})
		claimPodOn(name, node)
	}
	hold("linked-0", linked, 0)
	hold("fuller-0", fuller, 0)
	hold("fuller-4", fuller, 4)
	e.waitBound(30*time.Second, "linked-0", "fuller-0", "fuller-4")
	e.createClaim("four", "gpu", &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4})
	claimPodOn("four", "")
	if got := e.waitBound(30*time.Second, "four")["four"].Spec.NodeName; got != linked {
		t.Errorf("the 4-card claim's pod went to %s, want %s, where a quad is free", got, linked)
	}
}
