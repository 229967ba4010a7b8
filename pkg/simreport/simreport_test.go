package simreport_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/simreport"
)

// run is a curve that allocates everything that arrives up to full.
func run(trace, policy string, seed uint64, full float64) simreport.Run {
	a := make([]float64, sim.MaxArrivedPercent+1)
	for p := range a {
		a[p] = min(float64(p), full)
	}
	return simreport.Run{Trace: trace, Policy: policy, Seed: seed, TotalGPUs: 6212, Allocation: a}
}

func TestCSVRoundTrip(t *testing.T) {
	runs := []simreport.Run{run("default", "tessera-binpack", 42, 91.5), run("gpushare40", "06-FGD", 43, 95.25)}
	var buf bytes.Buffer
	if err := simreport.WriteCSV(&buf, runs); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "workload,sc_policy,tune,seed,total_gpus,0,1,") ||
		!strings.Contains(buf.String(), "openb_pod_list_default,tessera-binpack,1.3,42,6212,0.00,1.00,") {
		t.Errorf("not the artifact's layout:\n%.200s", buf.String())
	}
	got, err := simreport.ReadCSV(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(runs, got); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
	if _, err := simreport.ReadCSV(strings.NewReader("a,b\n1,2\n")); err == nil {
		t.Error("a file in another layout was read")
	}
}

func TestMeansAndTable(t *testing.T) {
	tessera := simreport.Means([]simreport.Run{run("default", "tessera-fragmentation-aware", 42, 96), run("default", "tessera-fragmentation-aware", 43, 95)})
	var artifactRuns []simreport.Run
	for seed := uint64(42); seed <= 51; seed++ {
		artifactRuns = append(artifactRuns, run("default", "06-FGD", seed, 95.23))
	}
	artifact := simreport.Means(artifactRuns)
	if len(tessera) != 1 || tessera[0].Seeds != 2 || tessera[0].Unallocated() != 4.5 {
		t.Fatalf("means %+v, want one of 2 seeds at 4.5%% unallocated", tessera)
	}
	table := simreport.Table(tessera, artifact, []string{"tessera-fragmentation-aware"}, []string{"default"})
	want := "| default | **4.50 (2 seeds)** | – | – | – | – | – | 4.77 |"
	if !strings.Contains(table, want) {
		t.Errorf("table lacks row %q:\n%s", want, table)
	}
	path := filepath.Join(t.TempDir(), "default.png")
	if err := simreport.Plot(path, "default", tessera, artifact); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() < 1000 {
		t.Errorf("plot not written: %v %v", fi, err)
	}
}
