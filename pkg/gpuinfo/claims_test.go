package gpuinfo_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestDRADeviceNames(t *testing.T) {
	for i := range gpuinfo.MaxCardsPerNode {
		if got, ok := gpuinfo.DRACardIndex(gpuinfo.DRADeviceName(i)); !ok || got != i {
			t.Errorf("gpuinfo.DRACardIndex(gpuinfo.DRADeviceName(%d)) = %d, %v", i, got, ok)
		}
	}
	for _, name := range []string{"gpu-", "gpu-01", "gpu--1", "gpu-x", "card-0", "gpu-999"} {
		if i, ok := gpuinfo.DRACardIndex(name); ok {
			t.Errorf("gpuinfo.DRACardIndex(%q) = %d, true; want not a card", name, i)
		}
	}
}

func TestDecodeDRAParameters(t *testing.T) {
	for _, tc := range []struct{ raw, wantErr string }{
		{raw: `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig"}`},
		{raw: `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","sharing":"Whole","taskPriority":"high"}`},
		{raw: `{"apiVersion":"v1","kind":"GPUConfig"}`, wantErr: "apiVersion and kind must be tessera.io/v1alpha1 and GPUConfig"},
		{raw: `{"apiVersion":"tessera.io/v1alpha1","kind":"GPUConfig","taskPriority":"urgent"}`, wantErr: `taskPriority must be high or low, got "urgent"`},
		{raw: `{"apiVersion":`, wantErr: "parameters of driver tessera.io"},
	} {
		_, err := gpuinfo.DecodeDRAParameters([]byte(tc.raw))
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("gpuinfo.DecodeDRAParameters(%s) = %v, want error containing %q", tc.raw, err, tc.wantErr)
		}
	}
}

// TestDRATopology reads the topology attributes of cards' devices, hostile
// values dropped, and the link they tell between two cards.
func TestDRATopology(t *testing.T) {
	device := func(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) *resourceapi.Device {
		return &resourceapi.Device{
			Name:       gpuinfo.DRADeviceName(0),
			Attributes: attrs,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				gpuinfo.DRAMemory: {Value: resource.MustParse("1Gi")}, gpuinfo.DRACores: {Value: resource.MustParse("100")},
			},
		}
	}
	topo := func(domain int64, root string, numa int64) (int64, gpuinfo.Card) {
		d := device(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			gpuinfo.DRANVLinkDomainAttribute: {IntValue: ptr.To(domain)},
			gpuinfo.DRAPCIeRootAttribute:     {StringValue: ptr.To(root)},
			gpuinfo.DRANUMANodeAttribute:     {IntValue: ptr.To(numa)},
		})
		card, ok := gpuinfo.DRACard(d)
		if !ok {
			t.Fatalf("device %+v is not a card", d)
		}
		return gpuinfo.DRANVLinkDomain(d), card
	}
	tests := []struct {
		name string
		a, b [3]any
		want gpuinfo.LinkClass
	}{
		{"one NVLink domain", [3]any{int64(1), "pci0000:00", int64(0)}, [3]any{int64(1), "pci0000:80", int64(1)}, gpuinfo.LinkNVLink},
		{"two domains, one root", [3]any{int64(1), "pci0000:00", int64(0)}, [3]any{int64(2), "pci0000:00", int64(0)}, gpuinfo.LinkHostBridge},
		{"one NUMA node", [3]any{int64(0), "pci0000:00", int64(0)}, [3]any{int64(0), "pci0000:40", int64(0)}, gpuinfo.LinkNUMANode},
		{"two sockets", [3]any{int64(0), "pci0000:00", int64(0)}, [3]any{int64(0), "pci0000:80", int64(1)}, gpuinfo.LinkSystem},
		{"hostile values count as unknown", [3]any{int64(-3), "../../pci", int64(-1)}, [3]any{int64(-3), "../../pci", int64(5000)}, gpuinfo.LinkUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			da, a := topo(tc.a[0].(int64), tc.a[1].(string), tc.a[2].(int64))
			db, b := topo(tc.b[0].(int64), tc.b[1].(string), tc.b[2].(int64))
			if got := gpuinfo.DRALink(da, db, &a, &b); got != tc.want {
				t.Errorf("link = %v, want %v (cards %+v, %+v)", got, tc.want, a, b)
			}
		})
	}
}
