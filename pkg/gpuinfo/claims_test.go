package gpuinfo_test

import (
	"strings"
	"testing"

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
