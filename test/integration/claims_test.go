package integration

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/dra"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// claimNode is a node whose agent serves its cards through the DRA driver,
// under the agent's identity.
type claimNode struct {
	name   string
	cards  []discovery.Card
	driver *dra.Driver
	socket string
}

// draNode starts a node with two L4 cards served as DRA devices. An
// inventory annotation then written on the node (as by an agent still
// serving the extended resources) is removed by the agent's next scan.
func (e *env) draNode(suffix string) *claimNode {
	e.tCtx.Helper()
	name := e.ns + "-" + suffix
	dir := e.tCtx.TempDir()
	a, driver, err := controlPlane.AddDRANode(e.tCtx, name, cluster.L4, 2, dir)
	e.nodes = append(e.nodes, name)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	inv, err := cluster.SimulatedInventory(name, cluster.L4, 2)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	raw, err := inv.Encode()
	if err != nil {
		e.tCtx.Fatal(err)
	}
	if err := controlPlane.PublishInventory(e.tCtx, name, raw); err != nil {
		e.tCtx.Fatal(err)
	}
	if err := a.Once(e.tCtx); err != nil {
		e.tCtx.Fatal(err)
	}
	e.tCtx.Cleanup(func() {
		_ = e.client.ResourceV1().ResourceSlices().DeleteCollection(e.tCtx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
	})
	var cards []discovery.Card
	for _, c := range inv.Cards {
		cards = append(cards, discovery.Card{Index: c.Index, UUID: c.UUID, Model: c.Model, MemoryMiB: c.MemoryMiB, NUMANode: c.NUMANode, Healthy: c.Healthy})
	}
	return &claimNode{name: name, cards: cards, driver: driver, socket: filepath.Join(dir, "plugin", "dra.sock")}
}

// shareClaim creates a claim for one card's share: memory GiB and cores %.
func (e *env) shareClaim(name string, memoryGiB, cores int64) *resourceapi.ResourceClaim {
	e.tCtx.Helper()
	return e.createClaim(name, "gpu", &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu-share.tessera.io",
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			gpuinfo.DRAMemory: *resource.NewQuantity(memoryGiB<<30, resource.BinarySI),
			gpuinfo.DRACores:  *resource.NewQuantity(cores, resource.DecimalSI),
		}},
	})
}

// createClaim creates a claim of one request.
func (e *env) createClaim(name, request string, exactly *resourceapi.ExactDeviceRequest) *resourceapi.ResourceClaim {
	e.tCtx.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: request, Exactly: exactly}}}},
	}
	created, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.tCtx, claim, metav1.CreateOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return created
}

// claimPod creates a pod whose one container uses the named claim.
func (e *env) claimPod(name, scheduler, claim string) {
	e.tCtx.Helper()
	pod := e.podSpec(name, scheduler, nil)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	e.create(pod)
}

// TestClaims schedules pods with DRA claims for shares of Tessera's cards,
// published by the node agent's DRA driver, through the shipped scheduler
// profiles, and prepares one through the driver's kubelet socket.
func TestClaims(t *testing.T) {
	e := newEnv(t)
	nodes := []*claimNode{e.draNode("dra-a"), e.draNode("dra-b")}
	for _, n := range nodes {
		e.waitFor(30*time.Second, "the driver's ResourceSlice of "+n.name, func() (bool, error) {
			list, err := e.client.ResourceV1().ResourceSlices().List(e.tCtx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + n.name})
			return err == nil && len(list.Items) == 1 && len(list.Items[0].Spec.Devices) == 2, err
		})
		node, err := e.client.CoreV1().Nodes().Get(e.tCtx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := node.Annotations[gpuinfo.InventoryAnnotation]; ok {
			t.Errorf("node %s served by DRA carries %s: its cards would be counted twice", n.name, gpuinfo.InventoryAnnotation)
		}
	}
	e.startScheduler()

	// Binpack puts the second share beside the first; spread puts the
	// third on the other node.
	e.shareClaim("first", 7, 30)
	e.claimPod("first", "tessera-binpack", "first")
	first := e.waitBound(30*time.Second, "first")["first"].Spec.NodeName
	e.shareClaim("packed", 7, 30)
	e.claimPod("packed", "tessera-binpack", "packed")
	if got := e.waitBound(30*time.Second, "packed")["packed"].Spec.NodeName; got != first {
		t.Errorf("tessera-binpack put the second share on %s, want %s beside the first", got, first)
	}
	e.shareClaim("spread", 7, 30)
	e.claimPod("spread", "tessera-spread", "spread")
	if got := e.waitBound(30*time.Second, "spread")["spread"].Spec.NodeName; got == first {
		t.Errorf("tessera-spread put its share on %s, the busier node", got)
	}

	// Fill the four cards: an L4 (23,034 MiB, 100 %) holds three 7 GiB /
	// 30 % shares and not a fourth; the thirteenth share stays pending, as
	// does one larger than any card.
	names := []string{"first", "packed", "spread"}
	for i := len(names); i < 12; i++ {
		name := fmt.Sprintf("share-%d", i)
		e.shareClaim(name, 7, 30)
		e.claimPod(name, "tessera-binpack", name)
		names = append(names, name)
	}
	e.waitBound(time.Minute, names...)
	perCard := map[string][]string{}
	for _, name := range names {
		claim, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			perCard[r.Pool+"/"+r.Device] = append(perCard[r.Pool+"/"+r.Device], name)
		}
	}
	for card, claims := range perCard {
		if len(claims) != 3 {
			t.Errorf("card %s holds %d shares %v, want 3 (23,034 MiB and 100 %% of compute; 7 GiB and 30 %% each)", card, len(claims), claims)
		}
	}
	if len(perCard) != 4 {
		t.Errorf("shares landed on %d cards, want all 4: %v", len(perCard), perCard)
	}
	e.shareClaim("overflow", 7, 30)
	e.claimPod("overflow", "tessera-binpack", "overflow")
	e.shareClaim("too-big", 30, 10)
	e.claimPod("too-big", "tessera-binpack", "too-big")
	for name, why := range map[string]string{
		"overflow": "the most free on any of the 4 Tessera cards: 1530 MiB, 10 % of compute",
		"too-big":  "too-big/gpu asks 1 card(s) with 30720 MiB and 10 % of compute each, more memory than any Tessera card has (the largest: 23034 MiB)",
	} {
		e.waitFor(30*time.Second, name+" to be found unschedulable", func() (bool, error) {
			pod, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
			if err != nil || pod.Spec.NodeName != "" {
				return false, fmt.Errorf("pod %s bound to %q (%v); no card has room", name, pod.Spec.NodeName, err)
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == v1.PodScheduled && c.Reason == v1.PodReasonUnschedulable {
					if !strings.Contains(c.Message, "cannot allocate all claims") || !strings.Contains(c.Message, why) {
						return false, fmt.Errorf("pod %s's condition does not say the claims cannot be allocated, and why (%q): %q", name, why, c.Message)
					}
					return true, nil
				}
			}
			return false, nil
		})
	}

	// kubelet's side: prepare the first claim over the driver's socket and
	// inject its CDI devices as a runtime would.
	claim, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.tCtx, "first", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := nodes[slices.IndexFunc(nodes, func(n *claimNode) bool { return n.name == first })]
	conn, err := grpc.NewClient("unix://"+node.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(e.tCtx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: e.ns, Name: "first", Uid: string(claim.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	prepared := resp.Claims[string(claim.UID)]
	if prepared == nil || prepared.Error != "" || len(prepared.Devices) != 1 {
		t.Fatalf("NodePrepareResources = %+v, want one device", prepared)
	}
	result := claim.Status.Allocation.Devices.Results[0]
	var card discovery.Card
	for _, c := range node.cards {
		if fmt.Sprintf("gpu-%d", c.Index) == result.Device {
			card = c
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(node.driver.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &rspec.Spec{Process: &rspec.Process{}, Linux: &rspec.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, prepared.Devices[0].CdiDeviceIds[0]); err != nil {
		t.Fatalf("injecting %v: %v (unresolved %v)", prepared.Devices[0].CdiDeviceIds, err, unresolved)
	}
	paths := node.driver.Enforce.Paths
	region := "claim-" + string(claim.UID) + ".cache"
	wantEnv := []string{
		"TESSERA_CLAIM=" + string(claim.UID),
		"NVIDIA_VISIBLE_DEVICES=" + card.UUID,
		"CUDA_DEVICE_MEMORY_LIMIT_0=7168m",
		"CUDA_DEVICE_SM_LIMIT_0=30",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache/" + region,
		"GPU_CORE_UTILIZATION_POLICY=force",
		"CUDA_TASK_PRIORITY=1",
		"TESSERA_CLAIM_GPU_0=" + card.UUID,
	}
	if diff := cmp.Diff(wantEnv, spec.Process.Env); diff != "" {
		t.Errorf("CDI environment (-want,+got):\n%s", diff)
	}
	var mounts []string
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Source+":"+m.Destination)
	}
	// The claim's own region, and no other.
	wantMounts := []string{paths.HostLibrary + ":/usr/local/vgpu/libvgpu.so", paths.HostPreload + ":/etc/ld.so.preload", filepath.Join(paths.HostCacheDir, region) + ":/usr/local/vgpu/cache/" + region}
	// The CDI library orders mounts by their container paths.
	slices.Sort(wantMounts)
	slices.Sort(mounts)
	if diff := cmp.Diff(wantMounts, mounts); diff != "" {
		t.Errorf("CDI mounts (-want,+got):\n%s", diff)
	}
	if got, want := prepared.Devices[0].CdiDeviceIds[1], fmt.Sprintf("nvidia.com/gpu=%d", card.Index); got != want {
		t.Errorf("the toolkit's CDI device = %q, want %q", got, want)
	}
	unprepared, err := drapb.NewDRAPluginClient(conn).NodeUnprepareResources(e.tCtx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: e.ns, Name: "first", Uid: string(claim.UID)}}})
	if err != nil || unprepared.Claims[string(claim.UID)].GetError() != "" {
		t.Fatalf("NodeUnprepareResources = %+v, %v", unprepared, err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	if d := cache.GetDevice(prepared.Devices[0].CdiDeviceIds[0]); d != nil {
		t.Errorf("CDI device %s still defined after unprepare", prepared.Devices[0].CdiDeviceIds[0])
	}

	// A card out of service is republished at once, tainted NoSchedule.
	other := nodes[1-slices.Index(nodes, node)]
	cards := slices.Clone(other.cards)
	cards[1].Healthy = false
	other.driver.Update(cards)
	e.waitFor(30*time.Second, "card 1 of "+other.name+" to be published tainted", func() (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(e.tCtx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + other.name})
		if err != nil || len(list.Items) != 1 {
			return false, err
		}
		for _, d := range list.Items[0].Spec.Devices {
			if d.Name == "gpu-1" {
				return len(d.Taints) == 1 && d.Taints[0].Key == gpuinfo.DRAUnhealthyTaint && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule, nil
			}
		}
		return false, nil
	})
}
