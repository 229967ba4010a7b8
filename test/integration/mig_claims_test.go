package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// migClaim creates a claim for one MIG slice of class mig.tessera.io that
// the CEL selector picks.
func (e *env) migClaim(name, selector string) {
	e.tCtx.Helper()
	e.createClaim(name, "slice", &resourceapi.ExactDeviceRequest{
		DeviceClassName: "mig.tessera.io",
		Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}},
	})
}

// allocatedDevice is the one device the named claim was allocated.
func (e *env) allocatedDevice(name string) string {
	e.tCtx.Helper()
	claim, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		e.tCtx.Fatalf("claim %s: allocation %+v, want one device", name, claim.Status.Allocation)
	}
	return claim.Status.Allocation.Devices.Results[0].Device
}

// waitClaimsUnschedulable waits until the named pod is found unschedulable
// because its claims cannot be allocated.
func (e *env) waitClaimsUnschedulable(name string) {
	e.tCtx.Helper()
	e.waitFor(30*time.Second, name+" to be found unschedulable", func() (bool, error) {
		pod, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil || pod.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s bound to %q (%v); no slice is free", name, pod.Spec.NodeName, err)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Reason == v1.PodReasonUnschedulable {
				if !strings.Contains(c.Message, "cannot allocate all claims") {
					return false, fmt.Errorf("pod %s's condition does not say its claims cannot be allocated: %q", name, c.Message)
				}
				return true, nil
			}
		}
		return false, nil
	})
}

// TestMIGClaims: MIG slices as claims, allocated by kube-scheduler's own
// DRA allocator from what the node agent's driver publishes. On a static
// card a claim gets the slice the operator made; on a dynamic card the
// placements share the card's slots through counters, so the allocator
// never gives out two that overlap; preparing a claim over the driver's
// kubelet socket makes its slice, and unpreparing destroys it.
func TestMIGClaims(t *testing.T) {
	e := newEnv(t)
	name := e.ns + "-mig"
	dir := t.TempDir()
	// Card 0 static, a 3g.20gb at slot 4; card 1 dynamic, uncut.
	a, _, err := controlPlane.AddDRANodeOf(e.tCtx, name, "1xA100-40GB:mig=3g.20gb@4,1xA100-40GB:mig-dynamic=", dir)
	e.nodes = append(e.nodes, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.ResourceV1().ResourceSlices().DeleteCollection(e.tCtx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
	})
	backend := a.Backend.(*discovery.Simulated)
	e.waitFor(30*time.Second, "the driver's ResourceSlices of "+name, func() (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(e.tCtx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
		if err != nil || len(list.Items) != 2 {
			return false, err
		}
		var devices, counterSets int
		for _, s := range list.Items {
			devices += len(s.Spec.Devices)
			counterSets += len(s.Spec.SharedCounters)
		}
		// Two cards, the static slice, 18 placements of plain profiles on
		// the dynamic card (NVIDIA's A100 40GB table); its counter set.
		return devices == 21 && counterSets == 1, nil
	})
	e.startScheduler()

	const dynamic = `device.attributes["tessera.io"].dynamic && `
	steps := []struct {
		claim, selector string
		// want is the device allocated; "" when none may be.
		want string
	}{
		// The operator's slice, by profile (before the dynamic card's
		// placements of the profile, as a slice that exists).
		{"static", `device.attributes["tessera.io"].profile == "3g.20gb"`, "gpu-0-mig-3g20gb-4"},
		// A 4g.20gb can start at slot 0 only: slots 0-3.
		{"four", dynamic + `device.attributes["tessera.io"].profile == "4g.20gb"`, "gpu-1-mig-4g20gb-0"},
		// The whole card overlaps it.
		{"seven", dynamic + `device.attributes["tessera.io"].profile == "7g.40gb"`, ""},
		// Another 3g.20gb fits at slot 4, not at 0.
		{"three", dynamic + `device.attributes["tessera.io"].profile == "3g.20gb"`, "gpu-1-mig-3g20gb-4"},
		// The card is full: not even the smallest slice.
		{"small", dynamic + `device.capacity["tessera.io"].memory.compareTo(quantity("4Gi")) >= 0`, ""},
	}
	for _, s := range steps {
		e.migClaim(s.claim, s.selector)
		e.claimPod(s.claim, "tessera-binpack", s.claim)
		if s.want == "" {
			e.waitClaimsUnschedulable(s.claim)
			continue
		}
		e.waitBound(30*time.Second, s.claim)
		if got := e.allocatedDevice(s.claim); got != s.want {
			t.Errorf("claim %s was allocated %s, want %s", s.claim, got, s.want)
		}
	}

	// kubelet's side: preparing "four" makes its slice.
	claim, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.tCtx, "four", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "plugin", "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	plugin := drapb.NewDRAPluginClient(conn)
	wire := []*drapb.Claim{{Namespace: e.ns, Name: "four", Uid: string(claim.UID)}}
	resp, err := plugin.NodePrepareResources(e.tCtx, &drapb.NodePrepareResourcesRequest{Claims: wire})
	if err != nil {
		t.Fatal(err)
	}
	prepared := resp.Claims[string(claim.UID)]
	if prepared == nil || prepared.Error != "" || len(prepared.Devices) != 1 {
		t.Fatalf("NodePrepareResources = %+v, want one device", prepared)
	}
	cards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	in, _ := cards[1].Slice("4g.20gb", 0)
	if in == nil {
		t.Fatalf("card 1 has no 4g.20gb slice at slot 0 after preparing: %+v", cards[1].MIG.Instances)
	}
	wantIDs := []string{"tessera.io/claim=" + string(claim.UID) + "-gpu-1-mig-4g20gb-0", fmt.Sprintf("nvidia.com/gpu=1:%d", in.Index)}
	if diff := cmp.Diff(wantIDs, prepared.Devices[0].CdiDeviceIds); diff != "" {
		t.Errorf("CDI devices (-want,+got):\n%s", diff)
	}
	// The slice a claim made keeps its slots counted (its allocation
	// holds them): the counters are as published before.
	e.waitFor(30*time.Second, "the counters of card 1 unchanged by the claim's slice", func() (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(e.tCtx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			for _, set := range s.Spec.SharedCounters {
				for slot, c := range set.Counters {
					if c.Value.Value() != 1 {
						return false, fmt.Errorf("counter %s of %s is %s, want 1", slot, set.Name, c.Value.String())
					}
				}
				return len(set.Counters) == 8, nil
			}
		}
		return false, nil
	})
	unprepared, err := plugin.NodeUnprepareResources(e.tCtx, &drapb.NodeUnprepareResourcesRequest{Claims: wire})
	if err != nil || unprepared.Claims[string(claim.UID)].GetError() != "" {
		t.Fatalf("NodeUnprepareResources = %+v, %v", unprepared, err)
	}
	if cards, _ := backend.Cards(); len(cards[1].MIG.Instances) != 0 {
		t.Errorf("card 1 has slices %+v after unprepare, want none", cards[1].MIG.Instances)
	}
}
