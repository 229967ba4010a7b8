package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/sim"
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
		tasks += fmt.Sprintf("task-%d,%d,1024,%d,%d,,LS,Running,%d,%d,0\n", i, 1000+500*(i%3), numGPU, milli, 100*i, 100*i+60*(1+i%7))
	}
	artifact := "workload,sc_policy,tune,seed,total_gpus"
	row := "openb_pod_list_tiny,06-FGD,1.3,42,24"
	for p := 0; p <= 130; p++ {
		artifact += fmt.Sprintf(",%d", p)
		row += fmt.Sprintf(",%d", min(p, 90))
	}
	untimed := "name,cpu_milli,memory_mib,num_gpu,gpu_milli\ntask-0,1000,1024,1,500\n"
	for name, content := range map[string]string{nodeFile: nodes, "openb_pod_list_tiny.csv": tasks, "openb_pod_list_untimed.csv": untimed, artifactFile: artifact + "\n" + row + "\n"} {
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
	if again, err := readRuns(filepath.Join(out, resultsFile), simreport.ReadCSV); err != nil || len(again) != 4 {
		t.Errorf("after re-running one job: %d runs (err %v), want 4", len(again), err)
	}
}

// TestRunDepartures runs the departures mode end to end: results for the
// shipped profiles and the random one, the table and a plot, and a task list
// without times refused by name.
func TestRunDepartures(t *testing.T) {
	tCtx := ktesting.Init(t)
	traces, out := t.TempDir(), t.TempDir()
	writeTrace(t, traces)
	o := options{traces: traces, workloads: "tiny", seeds: "1", parallel: 2, out: out, plotFormat: "svg", departures: true, load: 0.9, fleet: 1, arrivals: sim.DeparturePadding}
	var stdout, progress bytes.Buffer
	if err := run(tCtx, o, &stdout, &progress); err != nil {
		t.Fatal(err)
	}
	runs, err := readRuns(filepath.Join(out, departuresFile), simreport.ReadDeparturesCSV)
	if err != nil {
		t.Fatal(err)
	}
	var policies []string
	for _, r := range runs {
		policies = append(policies, r.Policy)
		if r.Load != 0.9 || r.Tasks != r.Placed+r.StillPending || r.Departed == 0 {
			t.Errorf("%s: load %v, %d tasks, %d placed, %d still pending, %d departed", r.Policy, r.Load, r.Tasks, r.Placed, r.StillPending, r.Departed)
		}
	}
	want := []string{"random", "tessera-binpack", "tessera-fragmentation-aware", "tessera-spread"}
	if diff := cmp.Diff(want, policies); diff != "" {
		t.Errorf("policies replayed (-want,+got):\n%s", diff)
	}
	// Half the fleet, with more arrivals: a setup of its own, beside the
	// whole fleet's.
	o.profiles, o.fleet, o.arrivals = "tessera-binpack", 0.5, 4
	if err := run(tCtx, o, &stdout, &progress); err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile(filepath.Join(out, departuresTableFile))
	for _, row := range []string{"| tiny | 0.90 | 24 | 2 |", "| tiny | 0.90 | 12 | 4 |"} {
		if err != nil || !strings.Contains(string(table), row) || !strings.Contains(string(table[strings.Index(string(table), row):]), "| tessera-binpack | 1 |") {
			t.Errorf("the table lacks tiny's binpack row %q (err %v):\n%s", row, err, table)
		}
	}
	for _, plot := range []string{"tiny-departures-load0.90.svg", "tiny-departures-load0.90-fleet0.5-arrivals4.svg"} {
		if _, err := os.Stat(filepath.Join(out, plot)); err != nil {
			t.Error(err)
		}
	}
	o.profiles = ""
	o.workloads = "untimed"
	if err := run(tCtx, o, &stdout, &progress); err == nil || !strings.Contains(err.Error(), "task list untimed has no creation and deletion times") {
		t.Errorf("a task list without times: got %v", err)
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

// TestRunBound: --bound writes, per task list, the bound on unallocated GPU
// and the offline packer's result over the seeds; no packing leaves less
// unallocated than the bound.
func TestRunBound(t *testing.T) {
	traces, out := t.TempDir(), t.TempDir()
	writeTrace(t, traces)
	o := options{traces: traces, workloads: "tiny", seeds: "1-2", out: out}
	var stdout bytes.Buffer
	if err := runBound(o, &stdout); err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile(filepath.Join(out, boundTableFile))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(table), "\n") {
		if strings.HasPrefix(line, "| tiny |") {
			row = line
		}
	}
	var bound, offline float64
	if _, err := fmt.Sscanf(row, "| tiny | %f | %s | %f |", &bound, new(string), &offline); err != nil {
		t.Fatalf("no row for the task list in:\n%s (%v)", table, err)
	}
	t.Logf("bound %.2f%%, offline packer %.2f%% unallocated", bound, offline)
	if bound < 0 || offline > 100 || bound > offline+1e-9 {
		t.Errorf("bound %.2f%% and offline packer %.2f%% unallocated: want 0 ≤ bound ≤ offline ≤ 100", bound, offline)
	}
}
