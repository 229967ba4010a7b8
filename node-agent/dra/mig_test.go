package dra

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
)

// a100Placements are the plain profiles' placements on an A100 40GB, from
// NVIDIA's MIG user guide (profile, start slot, slots taken), in the order
// the driver publishes one dynamic card's: smallest memory first, fewer
// compute slices first, higher starts first.
var a100Placements = []struct {
	profile     string
	start, size int
}{
	{"1g.5gb", 6, 1}, {"1g.5gb", 5, 1}, {"1g.5gb", 4, 1}, {"1g.5gb", 3, 1}, {"1g.5gb", 2, 1}, {"1g.5gb", 1, 1}, {"1g.5gb", 0, 1},
	{"1g.10gb", 6, 2}, {"1g.10gb", 4, 2}, {"1g.10gb", 2, 2}, {"1g.10gb", 0, 2},
	{"2g.10gb", 4, 2}, {"2g.10gb", 2, 2}, {"2g.10gb", 0, 2},
	{"3g.20gb", 4, 4}, {"3g.20gb", 0, 4},
	{"4g.20gb", 0, 4},
	{"7g.40gb", 0, 8},
}

// migNode is a simulated node of two A100 40GB cards in MIG mode: card 0
// static with a 3g.20gb slice at slot 4, card 1 dynamic, with the slices
// given.
func migNode(t *testing.T, dynamic string) (*discovery.Simulated, *Driver) {
	t.Helper()
	backend, err := discovery.NewSimulated(node, "1xA100-40GB:mig=3g.20gb@4,1xA100-40GB:mig-dynamic="+dynamic)
	if err != nil {
		t.Fatal(err)
	}
	cfg := enforce.DefaultConfig()
	cfg.Paths.HostCacheDir = t.TempDir()
	d := &Driver{Node: node, Enforce: cfg, CDIDir: t.TempDir(), MIG: backend}
	cards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	d.Update(cards)
	return backend, d
}

// TestMIGResources: a static card's slices are devices of their own; a
// dynamic card's placements are devices consuming its slots from a counter
// set in a slice of its own, the slots of a slice no claim made taken out.
func TestMIGResources(t *testing.T) {
	backend, d := migNode(t, "1g.5gb@6")
	cards, _ := backend.Cards()
	res := resources(node, cards, d.owned)
	pool := res.Pools[node]
	if len(pool.Slices) != 2 || len(pool.Slices[0].SharedCounters) != 0 || len(pool.Slices[1].Devices) != 0 {
		t.Fatalf("pool has %d slices, want one of devices then one of counters: %+v", len(pool.Slices), pool.Slices)
	}
	devices := pool.Slices[0].Devices
	var names []string
	for _, dev := range devices {
		names = append(names, dev.Name)
	}
	want := []string{"gpu-0", "gpu-1"}
	var dynamic []string
	for _, p := range a100Placements {
		dynamic = append(dynamic, fmt.Sprintf("gpu-1-mig-%s-%d", strings.ReplaceAll(p.profile, ".", ""), p.start))
	}
	// The static 3g.20gb sorts before the dynamic card's, as a slice
	// that exists.
	want = append(want, dynamic[:14]...)
	want = append(want, "gpu-0-mig-3g20gb-4")
	want = append(want, dynamic[14:]...)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("devices (-want,+got):\n%s", diff)
	}
	static := devices[16]
	in, _ := cards[0].Slice("3g.20gb", 4)
	if got := static.Attributes["uuid"].StringValue; got == nil || *got != in.UUID || len(static.ConsumesCounters) != 0 || static.AllowMultipleAllocations != nil {
		t.Errorf("static slice %+v: want its MIG device's UUID, no counters, one claim", static)
	}
	for i, p := range a100Placements {
		dev := devices[2+i]
		if i >= 14 {
			dev = devices[3+i]
		}
		var slots []string
		for s := p.start; s < p.start+p.size; s++ {
			slots = append(slots, fmt.Sprintf("slot-%d", s))
		}
		var got []string
		if len(dev.ConsumesCounters) == 1 && dev.ConsumesCounters[0].CounterSet == "gpu-1-mig" {
			for name, c := range dev.ConsumesCounters[0].Counters {
				if c.Value.Value() == 1 {
					got = append(got, name)
				}
			}
		}
		if diff := cmp.Diff(slots, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
			t.Errorf("%s consumes (-want,+got):\n%s", dev.Name, diff)
		}
		if attr := dev.Attributes["profile"].StringValue; attr == nil || *attr != p.profile {
			t.Errorf("%s: profile attribute %v, want %s", dev.Name, attr, p.profile)
		}
	}
	counters := map[string]int64{}
	for name, c := range pool.Slices[1].SharedCounters[0].Counters {
		counters[name] = c.Value.Value()
	}
	// The 1g.5gb at slot 6 was made by no claim: its slot is not offered.
	wantCounters := map[string]int64{"slot-0": 1, "slot-1": 1, "slot-2": 1, "slot-3": 1, "slot-4": 1, "slot-5": 1, "slot-6": 0, "slot-7": 1}
	if diff := cmp.Diff(wantCounters, counters); diff != "" {
		t.Errorf("counters of card 1 (-want,+got):\n%s", diff)
	}
	// Made by a claim, its slot is counted: the claim's allocation holds it.
	res = resources(node, cards, map[sliceKey]types.UID{{1, "1g.5gb", 6}: "uid-9"})
	if got := res.Pools[node].Slices[1].SharedCounters[0].Counters["slot-6"].Value; got.Value() != 1 {
		t.Errorf("slot 6 under a claim's slice counts %s, want 1", got.String())
	}
}

// TestPrepareMIGSlice: preparing a claim of a dynamic placement makes the
// slice and hands over its MIG device whole; a restarted driver knows whose
// it is; unpreparing destroys it. A static slice is handed over as it is
// and left in place.
func TestPrepareMIGSlice(t *testing.T) {
	ctx := context.Background()
	backend, d := migNode(t, "")
	// The slices' CDI spec is told each change before the preparation
	// returns.
	var told []discovery.Card
	d.SliceSpec = func(cards []discovery.Card) error { told = cards; return nil }
	c := claim([]resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-1-mig-2g10gb-2", "", "")})
	got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err := got[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	cards, _ := backend.Cards()
	in, _ := cards[1].Slice("2g.10gb", 2)
	if in == nil {
		t.Fatalf("card 1 has no 2g.10gb slice at slot 2 after preparing: %+v", cards[1].MIG.Instances)
	}
	if len(told) != 2 || len(told[1].MIG.Instances) != 1 || told[1].MIG.Instances[0].UUID != in.UUID {
		t.Errorf("the slices' spec was told %+v, want card 1 with its new slice", told)
	}
	wantIDs := []string{"tessera.io/claim=uid-1-gpu-1-mig-2g10gb-2", fmt.Sprintf("nvidia.com/gpu=1:%d", in.Index)}
	if diff := cmp.Diff(wantIDs, got[c.UID].Devices[0].CDIDeviceIDs); diff != "" {
		t.Errorf("CDI devices (-want,+got):\n%s", diff)
	}
	env, _ := injected(t, d.CDIDir, wantIDs[0])
	if diff := cmp.Diff([]string{"TESSERA_CLAIM=uid-1", "NVIDIA_VISIBLE_DEVICES=" + in.UUID, "TESSERA_CLAIM_GPU_0=" + in.UUID}, env); diff != "" {
		t.Errorf("environment (-want,+got):\n%s", diff)
	}
	// Preparing again (kubelet retries) keeps the one slice.
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); got[c.UID].Err != nil {
		t.Fatal(got[c.UID].Err)
	}
	if cards, _ := backend.Cards(); len(cards[1].MIG.Instances) != 1 {
		t.Errorf("card 1 has slices %+v after a second preparation, want the one", cards[1].MIG.Instances)
	}
	// Another claim allocated the same placement (a stale allocation) is
	// refused, not given the slice.
	other := claim([]resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-1-mig-2g10gb-2", "", "")})
	other.UID = "uid-2"
	if got, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{other}); got[other.UID].Err == nil || !strings.Contains(got[other.UID].Err.Error(), "held by another claim (uid-1)") {
		t.Errorf("another claim's preparation of the slice: %v, want refused", got[other.UID].Err)
	}

	// A restarted driver reads the claim's slice from its spec.
	restarted := &Driver{Node: node, Enforce: d.Enforce, CDIDir: d.CDIDir, MIG: backend}
	if err := restarted.loadOwned(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[sliceKey]types.UID{{1, "2g.10gb", 2}: "uid-1"}, restarted.owned, cmp.AllowUnexported(sliceKey{})); diff != "" {
		t.Errorf("slices known after a restart (-want,+got):\n%s", diff)
	}
	restarted.Update(cards)
	told = nil
	restarted.SliceSpec = func(cards []discovery.Card) error { told = cards; return nil }
	if got, _ := restarted.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "uid-1"}}); got["uid-1"] != nil {
		t.Fatal(got["uid-1"])
	}
	if cards, _ := backend.Cards(); len(cards[1].MIG.Instances) != 0 {
		t.Errorf("card 1 has slices %+v after unprepare, want none", cards[1].MIG.Instances)
	}
	if len(told) != 2 || len(told[1].MIG.Instances) != 0 {
		t.Errorf("the slices' spec was told %+v after unprepare, want card 1 without slices", told)
	}
	if _, err := os.Stat(restarted.specPath("uid-1")); !os.IsNotExist(err) {
		t.Errorf("the claim's CDI spec is still there (%v)", err)
	}

	// The static slice: its MIG device, left in place on unprepare.
	s := claim([]resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-0-mig-3g20gb-4", "", "")})
	s.UID = "uid-3"
	got, _ = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{s})
	if err := got[s.UID].Err; err != nil {
		t.Fatal(err)
	}
	static, _ := cards[0].Slice("3g.20gb", 4)
	if diff := cmp.Diff([]string{"tessera.io/claim=uid-3-gpu-0-mig-3g20gb-4", fmt.Sprintf("nvidia.com/gpu=0:%d", static.Index)}, got[s.UID].Devices[0].CDIDeviceIDs); diff != "" {
		t.Errorf("static slice's CDI devices (-want,+got):\n%s", diff)
	}
	if got, _ := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "uid-3"}}); got["uid-3"] != nil {
		t.Fatal(got["uid-3"])
	}
	if cards, _ := backend.Cards(); len(cards[0].MIG.Instances) != 1 {
		t.Errorf("the static card's slices %+v after unprepare, want its one", cards[0].MIG.Instances)
	}
}

// TestPrepareMIGRefusals: what a slice claim cannot be prepared with.
func TestPrepareMIGRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		failure string
		wantErr string
	}{{
		name:    "a static slice the card does not have",
		results: []resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-0-mig-1g5gb-0", "", "")},
		wantErr: `request "slice": device gpu-0-mig-1g5gb-0 is not a MIG slice of card 0`,
	}, {
		name:    "a profile Tessera does not cut",
		results: []resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-1-mig-1g5gbme-0", "", "")},
		wantErr: `device gpu-1-mig-1g5gbme-0 is not a MIG slice of card 1`,
	}, {
		name:    "a slice and a share in one claim",
		results: []resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-1-mig-1g5gb-0", "", ""), result("share", "gpu-1", "1Gi", "10")},
		wantErr: `request "share": a claim holds either MIG slices or shares of cards, not both`,
	}, {
		name:    "the slice cannot be made",
		results: []resourceapi.DeviceRequestAllocationResult{result("slice", "gpu-1-mig-1g5gb-0", "", "")},
		failure: "insufficient resources",
		wantErr: `request "slice": creating MIG slice 1g.5gb at slot 0 of card 1: `,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			backend, d := migNode(t, "")
			backend.SetMIGFailure(tc.failure)
			c := claim(tc.results)
			got, _ := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
			if err := got[c.UID].Err; err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if len(d.owned) != 0 {
				t.Errorf("slices recorded as made: %v", d.owned)
			}
		})
	}
}

// injected is what a runtime makes of the CDI devices ids from the specs in
// dir: the container's environment and mounts (host:container).
func injected(t *testing.T, dir string, ids ...string) (env, mounts []string) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &rspec.Spec{Process: &rspec.Process{}, Linux: &rspec.Linux{}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Source+":"+m.Destination)
	}
	return spec.Process.Env, mounts
}
