package v1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestResourceNamesIn(t *testing.T) {
	disagree := []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: a
  - schedulerName: b
    pluginConfig:
      - name: GPUShare
        args:
          resourceNames: {gpu: example.com/gpu}
`)
	read := func(path string) []byte {
		raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", path))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	for _, tc := range []struct {
		name    string
		config  []byte
		want    gpuinfo.ResourceNames
		wantErr string
	}{
		{name: "the base's", config: read("manifests/base/scheduler/scheduler-config.yaml"), want: gpuinfo.DefaultResourceNames()},
		{name: "the hami-names overlay's", config: read("manifests/overlays/hami-names/scheduler-config.yaml"), want: gpuinfo.HAMiResourceNames()},
		{name: "profiles that disagree", config: disagree, wantErr: `profile "b" uses resource names`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResourceNamesIn(tc.config)
			checkNames(t, tc.want, got, tc.wantErr, err)
		})
	}
}

// TestParseResourceNames: the node agent's --resource-names, against names
// written out here, and against FormatResourceNames.
func TestParseResourceNames(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       gpuinfo.ResourceNames
		wantErr    string
	}{
		{name: "empty: Tessera's", want: gpuinfo.DefaultResourceNames()},
		{name: "HAMi's", text: "gpu=nvidia.com/gpu,memory=nvidia.com/gpumem,memoryPercent=nvidia.com/gpumem-percentage,cores=nvidia.com/gpucores", want: gpuinfo.HAMiResourceNames()},
		{name: "any order, spaces", text: " cores=nvidia.com/gpucores, memoryPercent=nvidia.com/gpumem-percentage,memory=nvidia.com/gpumem,gpu=nvidia.com/gpu", want: gpuinfo.HAMiResourceNames()},
		{name: "a key missing", text: "gpu=a.io/gpu,memory=a.io/mem,memoryPercent=a.io/pct", wantErr: "resourceNames.cores: Required value"},
		{name: "an unknown key", text: "gpu=a.io/gpu,mem=a.io/mem", wantErr: `"mem=a.io/mem" is not KEY=NAME`},
		{name: "no value", text: "gpu", wantErr: `"gpu" is not KEY=NAME`},
		{name: "a key twice", text: "gpu=a.io/gpu,gpu=b.io/gpu", wantErr: "gpu given twice"},
		{name: "not an extended resource", text: "gpu=gpu,memory=a.io/mem,memoryPercent=a.io/pct,cores=a.io/cores", wantErr: "resourceNames.gpu: Invalid value"},
		{name: "a name twice", text: "gpu=a.io/gpu,memory=a.io/gpu,memoryPercent=a.io/pct,cores=a.io/cores", wantErr: "resourceNames.memory: Duplicate value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseResourceNames(tc.text)
			checkNames(t, tc.want, got, tc.wantErr, err)
		})
	}
	for _, names := range []gpuinfo.ResourceNames{gpuinfo.DefaultResourceNames(), gpuinfo.HAMiResourceNames()} {
		got, err := ParseResourceNames(FormatResourceNames(names))
		checkNames(t, names, got, "", err)
	}
}

func checkNames(t *testing.T, want, got gpuinfo.ResourceNames, wantErr string, err error) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one containing %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("names (-want,+got):\n%s", diff)
	}
}
