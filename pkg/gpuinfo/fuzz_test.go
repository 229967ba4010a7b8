package gpuinfo_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// FuzzDecodeInventory checks that any input decodes or fails cleanly, and that
// whatever decodes survives a round trip unchanged.
func FuzzDecodeInventory(f *testing.F) {
	f.Add(testutil.MustEncode(testutil.Inventory("n", "NVIDIA A100-SXM4-80GB", 81920, 8)))
	f.Add(`{"version":1,"cards":[{"index":0,"uuid":"a","model":"T4","memoryMiB":-1,"cores":100}]}`)
	f.Add(`{"version":1,"cards":null}`)
	f.Add(testutil.MustEncode(testutil.MIGInventory("m", []string{"1g.5gb@0", "3g.20gb@4"}, nil)))
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, raw string) {
		checkRoundTrip(t, raw, gpuinfo.DecodeInventory, (*gpuinfo.Inventory).Encode)
	})
}

// checkRoundTrip decodes raw; whatever decodes must encode, decode again and
// come back unchanged.
func checkRoundTrip[T any](t *testing.T, raw string, decode func(string) (*T, error), encode func(*T) (string, error)) {
	v, err := decode(raw)
	if err != nil {
		return
	}
	again, err := encode(v)
	if err != nil {
		t.Fatalf("decoded value does not encode: %v", err)
	}
	back, err := decode(again)
	if err != nil {
		t.Fatalf("re-encoded value does not decode: %v", err)
	}
	if diff := cmp.Diff(v, back); diff != "" {
		t.Fatalf("round trip (-want,+got):\n%s", diff)
	}
}

// FuzzDecodeAssignment is FuzzDecodeInventory for assignments.
func FuzzDecodeAssignment(f *testing.F) {
	f.Add(`{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-0","memoryMiB":4096,"cores":30}]}}`)
	f.Add(`{"version":1,"containers":{"":[{"index":0,"uuid":"a","memoryMiB":1}]}}`)
	f.Add(`{"version":1,"containers":{"c":[{"index":70,"uuid":"a","memoryMiB":1}]}}`)
	f.Add(`{"version":2,"containers":{"c":[{"index":0,"uuid":"GPU-0","memoryMiB":4864,"cores":100,"mig":{"profile":"1g.5gb","start":6}}]}}`)
	f.Fuzz(func(t *testing.T, raw string) {
		checkRoundTrip(t, raw, gpuinfo.DecodeAssignment, (*gpuinfo.Assignment).Encode)
	})
}

// FuzzDecodeUseReport: an agent's use report, as a compromised agent could
// write it, decodes or is refused, never panics, and round-trips.
func FuzzDecodeUseReport(f *testing.F) {
	f.Add(`{"containers":[{"namespace":"a","pod":"p","uid":"u","container":"c","useMiB":900,"peakMiB":2100,"windowSeconds":1800}]}`)
	f.Add(`{"containers":[{"namespace":"a","pod":"p","container":"c","useMiB":5,"peakMiB":4}]}`)
	f.Add(`{"containers":null}`)
	f.Fuzz(func(t *testing.T, raw string) {
		checkRoundTrip(t, raw, gpuinfo.DecodeUseReport, (*gpuinfo.UseReport).Encode)
	})
}

// FuzzParsePodRequest feeds arbitrary quantities and selector annotations to
// the request parser: it must return a valid request or an error, never panic.
func FuzzParsePodRequest(f *testing.F) {
	f.Add("1", "4096", "", "30", "A100")
	f.Add("0", "", "50", "", "")
	f.Add("-1", "1e30", "101", "-5", ",,,")
	f.Fuzz(func(t *testing.T, gpu, mem, pct, cores, model string) {
		limits := v1.ResourceList{}
		names := gpuinfo.DefaultResourceNames()
		for name, value := range map[v1.ResourceName]string{names.GPU: gpu, names.Memory: mem, names.MemoryPercent: pct, names.Cores: cores} {
			if value == "" {
				continue
			}
			if hugeExponent(value) {
				return
			}
			q, err := resource.ParseQuantity(value)
			if err != nil {
				return
			}
			limits[name] = q
		}
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Limits: limits}}}}}
		if model != "" {
			pod.Annotations = map[string]string{gpuinfo.ModelAnnotation: model}
		}
		req, err := gpuinfo.ParsePodRequest(pod, names)
		if err != nil || req == nil {
			return
		}
		for _, c := range req.Containers {
			if c.Count < 1 || c.Count > gpuinfo.MaxCardsPerNode || c.Cores < 0 || c.Cores > 100 ||
				c.MemoryMiB < 0 || c.MemoryMiB > gpuinfo.MaxCardMemoryMiB || c.MemoryPercent < 0 || c.MemoryPercent > 100 ||
				(c.MemoryMiB > 0 && c.MemoryPercent > 0) {
				t.Fatalf("parser accepted an invalid request: %+v", c)
			}
		}
	})
}

// hugeExponent reports a decimal exponent of more than four digits, such as
// "1e-999999999": apimachinery's ParseQuantity takes time that grows with the
// exponent (hours for that one), which hangs the fuzz worker in the harness
// before the parser under test is reached. A pod carrying such a quantity is
// decoded by the API server, and by every client, before Tessera sees it.
func hugeExponent(value string) bool {
	i := strings.IndexAny(value, "eE")
	if i < 0 {
		return false
	}
	digits := strings.TrimLeft(value[i+1:], "+-")
	digits = strings.TrimLeft(digits, "0")
	return len(digits) > 4
}
