package simreport_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// departureRun is a departures replay whose allocation climbs to level and
// whose offered load is level plus 5.
func departureRun(policy string, seed uint64, level float64) simreport.DepartureRun {
	r := simreport.DepartureRun{Trace: "default", Policy: policy, Seed: seed, Load: 1.1, Fleet: 1, Arrivals: 2, TotalGPUs: 6212, Tasks: 100, Initial: 20, Placed: 90, Departed: 50, StillPending: 10,
		PendingForFullModel: int(seed) - 40, Window: 3600, WaitP50: 0, WaitP90: 30, WaitP99: 600, MultiCardWaitP90: 1200, Waited: 20}
	for s := 0; s <= sim.DepartureSamples; s++ {
		r.Allocation = append(r.Allocation, min(float64(2*s), level))
		r.Offered = append(r.Offered, min(float64(2*s), level)+5)
	}
	return r
}

func TestDeparturesCSVRoundTripAndTable(t *testing.T) {
	smaller := departureRun("tessera-binpack", 42, 60)
	smaller.Fleet, smaller.TotalGPUs = 0.25, 1553
	runs := []simreport.DepartureRun{departureRun("tessera-binpack", 42, 90), departureRun("tessera-binpack", 43, 80), departureRun("random", 42, 70), smaller}
	var buf bytes.Buffer
	if err := simreport.WriteDeparturesCSV(&buf, runs); err != nil {
		t.Fatal(err)
	}
	got, err := simreport.ReadDeparturesCSV(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(runs, got); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
	if _, err := simreport.ReadDeparturesCSV(strings.NewReader("workload,sc_policy\nx,y\n")); err == nil {
		t.Error("a file in another layout was read")
	}
	// The second half of the window (samples 50..100) is flat at the level.
	means := simreport.DepartureMeans(runs)
	if len(means) != 3 || means[0].Seeds != 2 || means[0].MeanAllocation != 85 || means[0].MeanOffered != 90 {
		t.Fatalf("means %+v, want binpack's 2 seeds on 6212 GPUs at 85%% allocated, 90%% offered, apart from its replay on 1553", means)
	}
	table := simreport.DeparturesTable(means, []string{"tessera-binpack", "random"})
	for _, want := range []string{
		"| default | 1.10 | 6212 | 2 | 60.0 min | tessera-binpack | 2 | 85.00 | 90.00 | 20.0 | 0 | 30 s | 10.0 min | 20.0 min | 10.0 | 2.5 |",
		"| default | 1.10 | 6212 | 2 | 60.0 min | random | 1 | 70.00 | 75.00 |",
		"| default | 1.10 | 1553 | 2 | 60.0 min | tessera-binpack | 1 | 60.00 | 65.00 |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	// A file from before the count of pods waiting for a full model: read,
	// the count unknown.
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(departuresCSV(t, runs)), "\n") {
		lines = append(lines, line[:strings.LastIndex(line, ",")])
	}
	old, err := simreport.ReadDeparturesCSV(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("reading a file without the last column: %v", err)
	}
	if old[0].PendingForFullModel != -1 {
		t.Errorf("a file without the column read %d pods waiting for a full model, want -1 (unknown)", old[0].PendingForFullModel)
	}
	if oldTable := simreport.DeparturesTable(simreport.DepartureMeans(old), []string{"tessera-binpack", "random"}); !strings.Contains(oldTable, "| 10.0 | – |") {
		t.Errorf("the table of a file without the column does not say the count is unknown:\n%s", oldTable)
	}
	if strings.Index(table, "| random |") < strings.Index(table, "| tessera-binpack |") {
		t.Errorf("policies not in the order given:\n%s", table)
	}
	path := filepath.Join(t.TempDir(), "default.svg")
	if err := simreport.PlotDepartures(path, simreport.DepartureSetup{Trace: "default", Load: 1.1, Fleet: 1, Arrivals: 2}, means); err != nil {
		t.Fatal(err)
	}
	if err := simreport.PlotDepartures(path, simreport.DepartureSetup{Trace: "default", Load: 0.5, Fleet: 1, Arrivals: 2}, means); err == nil {
		t.Error("a plot with no replays at that load was drawn")
	}
}

func TestFromDeparturesPercentiles(t *testing.T) {
	var waits []time.Duration
	for i := 1; i <= 100; i++ {
		waits = append(waits, time.Duration(i)*time.Second)
	}
	waits = append(waits, make([]time.Duration, 100)...) // 100 pods that did not wait
	res := &sim.DeparturesResult{Profile: "p", Waits: waits, MultiCardWaits: waits[:10], Allocation: make([]float64, sim.DepartureSamples+1), Offered: make([]float64, sim.DepartureSamples+1)}
	r := simreport.FromDepartures("default", res)
	// Sorted, the 200 waits are 100 zeros then 1..100 s: nearest rank.
	if r.WaitP50 != 0 || r.WaitP90 != 80 || r.WaitP99 != 98 || r.MultiCardWaitP90 != 9 || r.Waited != 50 {
		t.Errorf("p50 %v, p90 %v, p99 %v, multi-card p90 %v, waited %v%%; want 0, 80, 98, 9, 50", r.WaitP50, r.WaitP90, r.WaitP99, r.MultiCardWaitP90, r.Waited)
	}
}

// buf2 is the departures CSV of the runs.
func departuresCSV(t *testing.T, runs []simreport.DepartureRun) string {
	var buf bytes.Buffer
	if err := simreport.WriteDeparturesCSV(&buf, runs); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
