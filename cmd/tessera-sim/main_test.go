package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/simreport"
)

// writeTrace writes a small trace in openb's layout, and an artifact file
// with one FGD row for it.
func writeTrace(t *testing.T, dir string) {
	nodes := "sn,cpu_milli,memory_mib,gpu,model\n"
	for i := 0; i < 6; i++ {
		nodes += fmt.Sprintf("node-%d,32000,131072,4,T4\n", i)
	}
	tasks := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
	for i := 0; i < 40; i++ {
		numGPU, milli := 1, 250*(1+i%4)
		if i%5 == 0 {
			numGPU, milli = 2, 1000
		}
		tasks += fmt.Sprintf("task-%d,%d,1024,%d,%d,,LS,Running,0,0,0\n", i, 1000+500*(i%3), numGPU, milli)
	}
	artifact := "workload,sc_policy,tune,seed,total_gpus"
	row := "openb_pod_list_tiny,06-FGD,1.3,42,24"
	for p := 0; p <= 130; p++ {
		artifact += fmt.Sprintf(",%d", p)
		row += fmt.Sprintf(",%d", min(p, 90))
	}
	for name, content := range map[string]string{nodeFile: nodes, "openb_pod_list_tiny.csv": tasks, artifactFile: artifact + "\n" + row + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRun(t *testing.T) {
	tCtx := ktesting.Init(t)
	traces, out := t.TempDir(), t.TempDir()
	writeTrace(t, traces)
	o := options{traces: traces, workloads: "tiny", profiles: "tessera-binpack,tessera-fragmentation-aware", seeds: "1-2", parallel: 2, out: out, plotFormat: "svg"}
	var stdout, progress bytes.Buffer
	if err := run(tCtx, o, &stdout, &progress); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(out, resultsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs, err := simreport.ReadCSV(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 4 {
		t.Errorf("%d runs in %s, want 2 profiles × 2 seeds", len(runs), resultsFile)
	}
	summary, err := os.ReadFile(filepath.Join(out, tableFile))
	if err != nil || !strings.Contains(string(summary), "| tiny |") || !strings.Contains(string(summary), "| 10.00 (1 seed) |") {
		t.Errorf("summary lacks the trace row with the artifact's 10.00 (err %v):\n%s", err, summary)
	}
	if _, err := os.Stat(filepath.Join(out, "tiny.svg")); err != nil {
		t.Error(err)
	}
	if !strings.Contains(progress.String(), "(4/4 replays)") || strings.Contains(progress.String(), "\r") {
		t.Errorf("progress to a file is not a line per replay ending at 4/4 replays:\n%q", progress.String())
	}
	// A second run of one job keeps the other results.
	o.profiles, o.seeds = "tessera-binpack", "1"
	if err := run(tCtx, o, &stdout, &progress); err != nil {
		t.Fatal(err)
	}
	if again, err := readRuns(filepath.Join(out, resultsFile)); err != nil || len(again) != 4 {
		t.Errorf("after re-running one job: %d runs (err %v), want 4", len(again), err)
	}
}

func TestParseSeeds(t *testing.T) {
	if got, err := parseSeeds("42-44,50"); err != nil || fmt.Sprint(got) != "[42 43 44 50]" {
		t.Errorf("parseSeeds = %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "44-42"} {
		if _, err := parseSeeds(bad); err == nil {
			t.Errorf("parseSeeds(%q) accepted", bad)
		}
	}
}
