package enforce

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// toolkitSpec is a spec as nvidia-ctk cdi generate writes one: common edits
// (the control devices, a library mount, a hook) and a device per card and
// MIG device known when it ran.
const toolkitSpec = `cdiVersion: 0.6.0
kind: nvidia.com/gpu
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes: [{path: /dev/nvidiactl}, {path: /dev/nvidia-uvm}]
  mounts: [{hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15, options: [ro, nosuid, nodev, bind]}]
  hooks: [{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache]}]
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
`

// migCards are a static card 0 with a slice and a dynamic card 1 (device
// minor 3) with two, MIG devices 0 and 1.
func migCards() []discovery.Card {
	return []discovery.Card{
		{Index: 0, Minor: 0, UUID: "GPU-0", MIGEnabled: true, MIG: &gpuinfo.MIG{Slots: 8, Instances: []gpuinfo.MIGInstance{{Profile: "7g.40gb", UUID: "MIG-s", GPUInstance: 0}}}},
		{Index: 1, Minor: 3, UUID: "GPU-1", MIGEnabled: true, MIGDynamic: true, MIG: &gpuinfo.MIG{Slots: 8, Instances: []gpuinfo.MIGInstance{
			{Profile: "3g.20gb", Start: 4, UUID: "MIG-a", Index: 0, GPUInstance: 2, ComputeInstance: 0},
			{Profile: "1g.5gb", Start: 0, UUID: "MIG-b", Index: 1, GPUInstance: 9, ComputeInstance: 0},
		}}},
	}
}

// TestMIGSpecWriter: the spec of the dynamic card's slices, as the CDI
// library reads it: a device per slice with the card's node and the slice's
// two capability nodes, and the toolkit spec's common edits; removed once
// the card has no slice.
func TestMIGSpecWriter(t *testing.T) {
	toolkit, dir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(toolkit, "nvidia.yaml"), []byte(toolkitSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	caps := MIGCaps{Major: -1, Minors: map[string]int64{
		"gpu3/gi2/access": 30, "gpu3/gi2/ci0/access": 31, "gpu3/gi9/access": 90, "gpu3/gi9/ci0/access": 91, "gpu0/gi0/access": 1,
	}}
	w := &MIGSpecWriter{Dir: dir, ToolkitKind: "nvidia.com/gpu", ToolkitDirs: []string{toolkit, dir}, Caps: func() (MIGCaps, error) { return caps, nil }}
	cards := migCards()
	if err := w.Write(cards); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the CDI library refuses the spec: %v", errs)
	}
	if diff := cmp.Diff([]string{"tessera.io/mig=1:0", "tessera.io/mig=1:1"}, cache.ListDevices()); diff != "" {
		t.Errorf("devices (-want,+got):\n%s", diff)
	}
	for name, want := range map[string][]string{
		"tessera.io/mig=1:0": {"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"},
		"tessera.io/mig=1:1": {"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap90", "/dev/nvidia-caps/nvidia-cap91"},
	} {
		d := cache.GetDevice(name)
		var got []string
		for _, n := range d.ContainerEdits.DeviceNodes {
			got = append(got, n.Path)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s device nodes (-want,+got):\n%s", name, diff)
		}
	}
	spec := cache.GetDevice("tessera.io/mig=1:0").GetSpec()
	var common []string
	for _, n := range spec.ContainerEdits.DeviceNodes {
		common = append(common, n.Path)
	}
	common = append(common, spec.ContainerEdits.Env...)
	for _, m := range spec.ContainerEdits.Mounts {
		common = append(common, m.HostPath)
	}
	for _, h := range spec.ContainerEdits.Hooks {
		common = append(common, h.Path)
	}
	want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "NVIDIA_VISIBLE_DEVICES=void", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/bin/nvidia-cdi-hook"}
	if diff := cmp.Diff(want, common); diff != "" {
		t.Errorf("common edits (-want,+got), the toolkit's:\n%s", diff)
	}

	// A rewrite with the toolkit's spec read again does not take its own
	// spec for the toolkit's; no slices left removes it.
	cards[1].MIG.Instances = cards[1].MIG.Instances[:1]
	if err := w.Write(cards); err != nil {
		t.Fatal(err)
	}
	cards[1].MIG.Instances = nil
	if err := w.Write(cards); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, migSpecFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the spec is still there with no slice (%v)", err)
	}
}

// TestMIGSpecWithoutCaps: a slice whose capability devices the driver does
// not list gets no spec, with the reason, rather than one without them.
func TestMIGSpecWithoutCaps(t *testing.T) {
	w := &MIGSpecWriter{Dir: t.TempDir(), Caps: func() (MIGCaps, error) {
		return MIGCaps{Major: -1, Minors: map[string]int64{"gpu3/gi2/access": 30}}, nil
	}}
	err := w.Write(migCards())
	if err == nil || !strings.Contains(err.Error(), "card 1, MIG slice 3g.20gb at slot 4 (GPU instance 2, compute instance 0): the driver lists 1 of its 2 capability devices") {
		t.Errorf("error %v, want the slice and its missing capability", err)
	}
}

// TestDynamicSliceCDIName: with the agent writing the slices' spec, a
// dynamic card's slice goes to the container as a device of it; a static
// card's stays the toolkit's.
func TestDynamicSliceCDIName(t *testing.T) {
	c := DefaultConfig()
	c.MIGSpec = true
	entry := func(index int) gpuinfo.CardAssignment {
		return gpuinfo.CardAssignment{Index: index, UUID: "GPU", MemoryMiB: 1, Cores: 100, MIG: &gpuinfo.MIGSlice{Profile: "1g.5gb"}}
	}
	adj := c.Cards([]gpuinfo.CardAssignment{entry(1), entry(0)}, []SliceDevice{{MIGInstance: gpuinfo.MIGInstance{Index: 1}, Dynamic: true}, {MIGInstance: gpuinfo.MIGInstance{Index: 2}}}, true, "r", "1")
	if diff := cmp.Diff([]string{"tessera.io/mig=1:1", "nvidia.com/gpu=0:2"}, adj.CDIDevices); diff != "" {
		t.Errorf("CDI devices (-want,+got):\n%s", diff)
	}
}
