//go:build e2enode

package e2enode

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestMIGSlice: through the real runtime, containers given MIG slices of
// their own on one card each get their MIG device alone — its UUID, its CDI device (the card's
// node and the slice's two capability nodes, and no other slice's), no
// interception library — and a container sharing a slice gets its memory
// limit inside it and no compute limit.
func TestMIGSlice(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	own := podSpec(ns, "mig-own", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 4000}})
	own.Annotations = map[string]string{gpuinfo.IsolationAnnotation: gpuinfo.IsolationMIG}
	neighbour := podSpec(ns, "mig-neighbour", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 4000}})
	neighbour.Annotations = map[string]string{gpuinfo.IsolationAnnotation: gpuinfo.IsolationMIG}
	shared := podSpec(ns, "mig-shared", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 6000}})
	shared.Annotations = map[string]string{gpuinfo.IsolationAnnotation: gpuinfo.IsolationMIGShared}
	probe := podSpec(ns, "mig-probe", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 1000}})
	probe.Annotations = map[string]string{gpuinfo.IsolationAnnotation: gpuinfo.IsolationMIGShared}
	pods := schedule(tCtx, own, neighbour, shared, probe)

	// Slices of their own: the smallest that hold 4000 MiB, the two 1g.5gb
	// of one card, each whole, side by side.
	for _, name := range []string{"mig-own", "mig-neighbour"} {
		slice := cardsOf(tCtx, pods[name], "main")
		if len(slice) != 1 || slice[0].MIG == nil || slice[0].MIG.Profile != "1g.5gb" {
			t.Fatalf("%s got %+v, want a 1g.5gb slice", name, slice)
		}
		r := startContainer(tCtx, runSandbox(tCtx, pods[name], ""), pods[name], "main")
		checkEnv(t, name, r, map[string]string{"NVIDIA_VISIBLE_DEVICES": slice[0].MIG.UUID})
		checkSliceDevices(t, name, r, migInstances[map[int]int{5: 1, 6: 2}[slice[0].MIG.Start]])
		checkInterception(t, name, r, "")
	}

	// A share inside the 3g.20gb slice.
	share := cardsOf(tCtx, pods["mig-shared"], "main")
	if len(share) != 1 || share[0].MIG == nil || share[0].MIG.Profile != "3g.20gb" {
		t.Fatalf("mig-shared got %+v, want a share of the 3g.20gb slice", share)
	}
	r := startContainer(tCtx, runSandbox(tCtx, pods["mig-shared"], ""), pods["mig-shared"], "main")
	checkEnv(t, "a share inside a slice", r, map[string]string{
		"NVIDIA_VISIBLE_DEVICES": share[0].MIG.UUID, "CUDA_DEVICE_MEMORY_LIMIT_0": "6000m", "CUDA_DEVICE_SM_LIMIT_0": "0",
	})
	checkSliceDevices(t, "a share inside a slice", r, 1)

	// Where a runtime would honour a CDI annotation on the container, the
	// other slice's device (its capabilities) is refused beside a share of
	// the 3g.20gb slice (MIG device 0); that slice's own device passes.
	if p := cardsOf(tCtx, pods["mig-probe"], "main"); len(p) != 1 || p[0].MIG == nil || p[0].MIG.Profile != "3g.20gb" {
		t.Fatalf("mig-probe got %+v, want a share of the 3g.20gb slice", p)
	}
	box := runSandbox(tCtx, pods["mig-probe"], "")
	for _, tc := range []struct {
		what, device, wantErr string
	}{
		{"another slice beside its own", fmt.Sprintf("nvidia.com/gpu=%d:1", migCard),
			fmt.Sprintf("MIG capability device /dev/nvidia-caps/nvidia-cap%d (minor %d), which is not one of its own MIG slices'", capMinor(2, false), capMinor(2, false))},
		{"its own slice", fmt.Sprintf("nvidia.com/gpu=%d:0", migCard), ""},
	} {
		_, err := createAsKubeletWith(tCtx, box, pods["mig-probe"], "main", extra{annotations: map[string]string{"cdi.k8s.io/tenant": tc.device}})
		checkRefusal(t, tc.what, err, tc.wantErr)
	}
}

// checkSliceDevices checks that the running container has the card in MIG
// mode's node and the capability nodes of GPU instance gi, and no other
// GPU or capability node.
func checkSliceDevices(t *testing.T, what string, r *running, gi int) {
	t.Helper()
	if diff := cmp.Diff([]string{"nvidia-caps", fmt.Sprintf("nvidia%d", migCard), "nvidiactl"}, r.devices()); diff != "" {
		t.Errorf("%s: GPU device nodes (-want,+got):\n%s", what, diff)
	}
	caps, _ := filepath.Glob(fmt.Sprintf("/proc/%d/root/dev/nvidia-caps/*", r.pid))
	for i, c := range caps {
		caps[i] = filepath.Base(c)
	}
	sort.Strings(caps)
	want := []string{fmt.Sprintf("nvidia-cap%d", capMinor(gi, false)), fmt.Sprintf("nvidia-cap%d", capMinor(gi, true))}
	if diff := cmp.Diff(want, caps); diff != "" {
		t.Errorf("%s: MIG capability nodes (-want,+got):\n%s", what, diff)
	}
}
