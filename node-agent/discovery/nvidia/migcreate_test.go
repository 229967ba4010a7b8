package nvidia

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

var _ discovery.MIGController = (*NVML)(nil)

// sliceOp creates (or, with destroy, destroys) a MIG slice of a profile at a
// start, failing with wantErr unless it is empty.
type sliceOp struct {
	destroy bool
	profile string
	start   int
	wantErr string
}

// onGPUInstances makes fault apply to each GPU instance created on mock card
// d from now on.
func onGPUInstances(d *server.Device, fault func(gi *server.GpuInstance)) {
	create := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		gi, ret := create(info, at)
		if ret == nvml.SUCCESS {
			fault(gi.(*server.GpuInstance))
		}
		return gi, ret
	}
}

// TestMIGSlices: slices created through the NVML backend are discovered
// under the UUIDs it returned, and gone once destroyed; a slice NVML refuses,
// or whose compute instance or MIG device fails, leaves no GPU instance
// behind; and the card's MIG mode is never changed.
func TestMIGSlices(t *testing.T) {
	tests := []struct {
		name string
		// card is the card used: card 0 is in MIG mode, card 1 is not.
		card  int
		fault func(d *server.Device)
		ops   []sliceOp
		// want are the slices discovered at the end, by start: some of
		// those the ops created.
		want []sliceOp
	}{
		{name: "two slices", ops: []sliceOp{{profile: "3g.20gb", start: 4}, {profile: "1g.5gb", start: 0}},
			want: []sliceOp{{profile: "1g.5gb", start: 0}, {profile: "3g.20gb", start: 4}}},
		{name: "overlapping slice", ops: []sliceOp{
			{profile: "1g.5gb", start: 0},
			{profile: "4g.20gb", start: 0, wantErr: "creating MIG slice 4g.20gb@0 on card 0: creating its GPU instance: ERROR_INSUFFICIENT_RESOURCES"},
		}, want: []sliceOp{{profile: "1g.5gb", start: 0}}},
		{name: "start the profile does not allow", ops: []sliceOp{
			{profile: "2g.10gb", start: 1, wantErr: "profile 2g.10gb cannot start at slot 1 (its starts: [0 2 4])"},
		}},
		{name: "unknown profile", ops: []sliceOp{{profile: "5g.25gb", start: 0, wantErr: `the card has no MIG profile "5g.25gb"`}}},
		{name: "card not in MIG mode", card: 1, ops: []sliceOp{
			{profile: "1g.5gb", start: 0, wantErr: "creating MIG slice 1g.5gb@0 on card 1: the card is not in MIG mode"},
			{destroy: true, profile: "1g.5gb", start: 0},
		}},
		{name: "destroy", ops: []sliceOp{
			{profile: "3g.20gb", start: 4}, {profile: "1g.5gb", start: 0}, {destroy: true, profile: "3g.20gb", start: 4},
		}, want: []sliceOp{{profile: "1g.5gb", start: 0}}},
		{name: "destroy, then create over its slots", ops: []sliceOp{
			{profile: "3g.20gb", start: 4}, {destroy: true, profile: "3g.20gb", start: 4}, {profile: "2g.10gb", start: 4},
		}, want: []sliceOp{{profile: "2g.10gb", start: 4}}},
		{name: "destroy a missing slice", ops: []sliceOp{
			{profile: "3g.20gb", start: 4},
			{destroy: true, profile: "3g.20gb", start: 0}, {destroy: true, profile: "1g.5gb", start: 4}, {destroy: true, profile: "5g.25gb", start: 4},
		}, want: []sliceOp{{profile: "3g.20gb", start: 4}}},
		{name: "compute instance fails", fault: func(d *server.Device) {
			onGPUInstances(d, func(gi *server.GpuInstance) {
				gi.CreateComputeInstanceFunc = func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
					return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
				}
			})
		}, ops: []sliceOp{{profile: "3g.20gb", start: 4, wantErr: "creating its compute instance: ERROR_INSUFFICIENT_RESOURCES"}}},
		{name: "MIG device not listed", fault: func(d *server.Device) {
			d.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
		}, ops: []sliceOp{{profile: "3g.20gb", start: 4, wantErr: "NVML lists no MIG device of its GPU instance 0"}}},
		{name: "compute instances unlisted", fault: func(d *server.Device) {
			onGPUInstances(d, func(gi *server.GpuInstance) {
				gi.GetComputeInstancesFunc = func(*nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
					return nil, nvml.ERROR_UNKNOWN
				}
			})
		}, ops: []sliceOp{
			{profile: "3g.20gb", start: 4},
			{destroy: true, profile: "3g.20gb", start: 4, wantErr: "destroying MIG slice 3g.20gb@4 on card 0: listing its compute instances of profile 0: ERROR_UNKNOWN"},
		}, want: []sliceOp{{profile: "3g.20gb", start: 4}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := dgxa100.New()
			s.ErrorStringFunc = func(r nvml.Return) string { return r.Error() }
			mockCard(t, s, 0)
			d := s.Devices[tc.card].(*server.Device)
			mode := d.MigMode
			if tc.fault != nil {
				tc.fault(d)
			}
			_, n := scan(t, s)
			uuids := runSliceOps(t, n, tc.card, tc.ops)
			want := []gpuinfo.MIGInstance{}
			for _, w := range tc.want {
				uuid := uuids[w]
				want = append(want, mockSlice(t, d, w.profile, w.start, uuid))
			}
			if diff := gocmp.Diff(want, discoveredSlices(t, n, tc.card), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("instances discovered (-want,+got):\n%s", diff)
			}
			if got := len(d.GpuInstances); got != len(tc.want) {
				t.Errorf("%d GPU instances on the card, want %d", got, len(tc.want))
			}
			if d.MigMode != mode {
				t.Errorf("MIG mode changed from %d to %d", mode, d.MigMode)
			}
		})
	}
}

// runSliceOps runs ops on card index through n, checking their errors, and
// returns the UUIDs of the slices they created, by profile and start.
func runSliceOps(t *testing.T, n *NVML, index int, ops []sliceOp) map[sliceOp]string {
	t.Helper()
	uuids := map[sliceOp]string{}
	for _, op := range ops {
		if op.destroy {
			testutil.CheckError(t, n.DestroyMIGSlice(index, op.profile, op.start), op.wantErr)
			continue
		}
		uuid, err := n.CreateMIGSlice(index, op.profile, op.start)
		if !testutil.CheckError(t, err, op.wantErr) {
			uuids[sliceOp{profile: op.profile, start: op.start}] = uuid
		}
	}
	return uuids
}

// discoveredSlices are the MIG instances n discovers on card index; none
// when it has no MIG geometry.
func discoveredSlices(t *testing.T, n *NVML, index int) []gpuinfo.MIGInstance {
	t.Helper()
	cards, err := n.Cards()
	if err != nil {
		t.Fatal(err)
	}
	if err := discovery.Inventory(cards, gpuinfo.InventoryVersion2).Validate(); err != nil {
		t.Errorf("inventory is invalid: %v", err)
	}
	if cards[index].MIG == nil {
		return nil
	}
	return cards[index].MIG.Instances
}
