package sim_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/pkg/sim"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// cluster is a small mixed fleet: 2-card T4 nodes, 4-card A10 nodes and
// 8-card V100 nodes.
func cluster() []trace.Node {
	var nodes []trace.Node
	for i := 0; i < 4; i++ {
		nodes = append(nodes,
			trace.Node{Name: fmt.Sprintf("t4-%d", i), CPUMilli: 32000, MemoryMiB: 131072, GPUs: 2, Model: "T4"},
			trace.Node{Name: fmt.Sprintf("a10-%d", i), CPUMilli: 64000, MemoryMiB: 262144, GPUs: 4, Model: "A10"},
			trace.Node{Name: fmt.Sprintf("v100-%d", i), CPUMilli: 96000, MemoryMiB: 393216, GPUs: 8, Model: "V100M32"},
		)
	}
	nodes = append(nodes, trace.Node{Name: "cpu-only", CPUMilli: 96000, MemoryMiB: 393216})
	return nodes
}

// tasks is a deterministic mix of shares, whole cards, multi-card jobs,
// CPU-only tasks and tasks bound to a model.
func tasks() []trace.Task {
	var out []trace.Task
	for i := 0; i < 120; i++ {
		t := trace.Task{Name: fmt.Sprintf("task-%03d", i), CPUMilli: int64(1000 + 500*(i%9)), MemoryMiB: 4096}
		switch i % 6 {
		case 0, 1, 2:
			t.NumGPU, t.GPUMilli = 1, int64(100+(i*70)%900)
		case 3:
			t.NumGPU, t.GPUMilli = 1, 1000
		case 4:
			t.NumGPU, t.GPUMilli = []int{2, 4, 8}[i%3], 1000
		}
		if i%10 == 7 {
			t.GPUSpec = []string{"A10"}
		}
		out = append(out, t)
	}
	return out
}

func TestArrivals(t *testing.T) {
	nodes, ts := sim.GPUNodes(cluster()), tasks()
	capacity := sim.CapacityMilli(nodes)
	if len(nodes) != 12 || capacity != 4*(2+4+8)*1000 {
		t.Fatalf("%d GPU nodes with %d milli-GPU, want 12 with %d", len(nodes), capacity, 4*(2+4+8)*1000)
	}
	a := sim.Arrivals(ts, capacity, 42)
	var total int64
	names := map[string]bool{}
	for _, task := range a {
		total += task.GPUMilliTotal()
		if names[task.Name] {
			t.Fatalf("task %s arrives twice", task.Name)
		}
		names[task.Name] = true
	}
	if float64(total) < sim.Padding*float64(capacity) {
		t.Errorf("arrivals ask %d milli-GPU, want at least %.1f× capacity %d", total, sim.Padding, capacity)
	}
	for _, task := range ts {
		if !names[task.Name] {
			t.Errorf("task %s is missing from the arrivals", task.Name)
		}
	}
	if diff := cmp.Diff(a, sim.Arrivals(ts, capacity, 42)); diff != "" {
		t.Errorf("same seed, different arrivals (-first,+second):\n%s", diff)
	}
	if cmp.Equal(a, sim.Arrivals(ts, capacity, 43)) {
		t.Error("seeds 42 and 43 give the same arrivals")
	}
}

// TestReplay runs every shipped profile through the real scheduler and
// checks the curve: allocation never exceeds what arrived nor capacity,
// never falls (no departures), and a seed replays identically.
func TestReplay(t *testing.T) {
	tCtx := ktesting.Init(t)
	profiles, err := sim.Profiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(profiles) < 3 {
		t.Fatalf("shipped profiles %v, want binpack, spread and fragmentation-aware", profiles)
	}
	for _, profile := range profiles {
		t.Run(profile, func(t *testing.T) {
			cfg := sim.Config{Nodes: cluster(), Tasks: tasks(), Seed: 7, Profile: profile}
			res, err := sim.Run(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.Placed == 0 || res.Placed == res.Tasks {
				t.Fatalf("placed %d of %d tasks with %d scheduler errors; want some placed, some not (the arrivals exceed capacity), no errors", res.Placed, res.Tasks, res.Errors)
			}
			// The task that crosses a percentage may overshoot it by up to
			// its own size, 8 of the 56 cards.
			overshoot := 100 * 8.0 / 56
			for p, v := range res.Allocation {
				if v > float64(p)+overshoot || v > 100 || (p > 0 && v < res.Allocation[p-1]) {
					t.Fatalf("allocation %.2f%% at arrived %d%% (previous %.2f%%)", v, p, res.Allocation[max(p-1, 0)])
				}
			}
			again, err := sim.Run(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(res.Nodes, again.Nodes); diff != "" {
				t.Errorf("same seed placed pods on other nodes (-first,+second):\n%s", diff)
			}
		})
	}
	if _, err := sim.Run(tCtx, sim.Config{Nodes: cluster(), Tasks: tasks(), Profile: "default-scheduler"}); err == nil {
		t.Error("a profile that is not shipped was accepted")
	}
}

// timedTasks is tasks with durations: from one to ten minutes, some an
// hour.
func timedTasks() []trace.Task {
	ts := tasks()
	for i := range ts {
		ts[i].Duration, ts[i].HasDuration = time.Duration(1+i%10)*time.Minute, true
		if i%17 == 0 {
			ts[i].Duration = time.Hour
		}
	}
	return ts
}

// TestScaledFleet keeps the fleet's mix: the cluster has four nodes of each
// kind, so a quarter keeps one of each and half two.
func TestScaledFleet(t *testing.T) {
	kinds := func(nodes []trace.Node) map[string]int {
		out := map[string]int{}
		for _, n := range nodes {
			out[fmt.Sprintf("%s/%d", n.Model, n.GPUs)]++
		}
		return out
	}
	nodes := sim.GPUNodes(cluster())
	for _, tc := range []struct {
		fraction float64
		want     map[string]int
	}{
		{0.25, map[string]int{"T4/2": 1, "A10/4": 1, "V100M32/8": 1}},
		// Every model keeps a node where the sampling would pass one
		// over (A10 at 0.2, all of them at 0.01).
		{0.2, map[string]int{"T4/2": 1, "A10/4": 1, "V100M32/8": 1}},
		{0.01, map[string]int{"T4/2": 1, "A10/4": 1, "V100M32/8": 1}},
		{0.5, map[string]int{"T4/2": 2, "A10/4": 2, "V100M32/8": 2}},
		{1, map[string]int{"T4/2": 4, "A10/4": 4, "V100M32/8": 4}},
	} {
		got, err := sim.ScaledFleet(nodes, tc.fraction)
		if err != nil {
			t.Fatalf("fraction %v: %v", tc.fraction, err)
		}
		if diff := cmp.Diff(tc.want, kinds(got)); diff != "" {
			t.Errorf("fraction %v: nodes by kind (-want,+got):\n%s", tc.fraction, diff)
		}
	}
	for _, bad := range []float64{0, -0.5, 1.5} {
		if _, err := sim.ScaledFleet(nodes, bad); err == nil {
			t.Errorf("fraction %v accepted", bad)
		}
	}
}

// TestSteadyState checks that StationaryStart and ArrivalTimes hold the
// offered load at its level from the start: the GPU asked by the tasks
// present, computed here from their arrival and duration, averages the
// load in every quarter of the window. An empty start would be short in the
// first quarter, the window being a few times the longest duration.
func TestSteadyState(t *testing.T) {
	ts := timedTasks()
	const capacity = 560000
	var stream []trace.Task
	for range 200 {
		stream = append(stream, ts...)
	}
	for _, load := range []float64{0.25, 0.5, 1} {
		initial := sim.StationaryStart(ts, capacity, load, 42)
		times, err := sim.ArrivalTimes(ts, len(stream), capacity, load, 42)
		if err != nil {
			t.Fatalf("load %v: %v", load, err)
		}
		for i := 1; i < len(times); i++ {
			if times[i] < times[i-1] {
				t.Fatalf("load %v: arrival %d at %s before arrival %d at %s", load, i, times[i], i-1, times[i-1])
			}
		}
		window := times[len(times)-1]
		const steps = 200
		var quarters [4]float64
		for step := range steps {
			at := window * time.Duration(step) / steps
			var asked int64
			for _, task := range initial {
				if at < task.Duration {
					asked += task.GPUMilliTotal()
				}
			}
			for i, task := range stream {
				if times[i] <= at && at < times[i]+task.Duration {
					asked += task.GPUMilliTotal()
				}
			}
			quarters[step*4/steps] += float64(asked) / capacity / (steps / 4)
		}
		for q, got := range quarters {
			if math.Abs(got-load) > 0.1*load {
				t.Errorf("load %v: the tasks offer %.3f of capacity on average in quarter %d of the window", load, got, q+1)
			}
		}
	}
	if _, err := sim.ArrivalTimes(ts, 10, capacity, 0, 42); err == nil {
		t.Error("a load of 0 was accepted")
	}
	cpuOnly := []trace.Task{{Name: "cpu", CPUMilli: 1000, Duration: time.Hour, HasDuration: true}}
	if got := sim.StationaryStart(cpuOnly, capacity, 0.5, 42); got != nil {
		t.Errorf("tasks without GPU make a start of %d tasks, want none", len(got))
	}
}

// TestDepartures replays tasks that leave, under light and heavy load, and
// checks the accounting against the pods' own record: allocation never
// above what is offered nor capacity, every arrival placed or waiting,
// pods wait under overload and hardly at all under light load, and a seed
// replays identically.
func TestDepartures(t *testing.T) {
	tCtx := ktesting.Init(t)
	for _, tc := range []struct {
		profile         string
		load            float64
		fleet, arrivals float64
		gpus            int
	}{
		{"tessera-fragmentation-aware", 0.3, 0, 0, 56},
		{"tessera-binpack", 0.95, 0, 3, 56},
		{sim.RandomProfile, 0.95, 0, 3, 56},
		{"tessera-binpack", 0.95, 0.5, 6, 28},
	} {
		t.Run(fmt.Sprintf("%s-%v-fleet%v", tc.profile, tc.load, tc.fleet), func(t *testing.T) {
			cfg := sim.DeparturesConfig{Nodes: cluster(), Tasks: timedTasks(), Seed: 7, Profile: tc.profile, Load: tc.load, Fleet: tc.fleet, Arrivals: tc.arrivals}
			res, err := sim.RunDepartures(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.TotalGPUs != tc.gpus {
				t.Fatalf("replayed on %d GPUs, want %d", res.TotalGPUs, tc.gpus)
			}
			// Waits are of the placed tasks that arrived after the start.
			if res.Tasks != res.Placed+res.StillPending || res.Departed == 0 || res.Departed > res.Placed ||
				res.Initial == 0 || len(res.Waits) > res.Placed || res.Placed-len(res.Waits) > res.Initial {
				t.Fatalf("%d tasks (%d at the start), %d placed, %d departed, %d still pending, %d waits: inconsistent",
					res.Tasks, res.Initial, res.Placed, res.Departed, res.StillPending, len(res.Waits))
			}
			if res.PendingForFullModel < 0 || res.PendingForFullModel > res.StillPending {
				t.Fatalf("%d of %d waiting pods counted as waiting for a full model", res.PendingForFullModel, res.StillPending)
			}
			if len(res.Allocation) != sim.DepartureSamples+1 {
				t.Fatalf("%d samples, want %d", len(res.Allocation), sim.DepartureSamples+1)
			}
			for i, a := range res.Allocation {
				if a < 0 || a > 100 || a > res.Offered[i]+1e-9 {
					t.Fatalf("sample %d: allocation %.2f%% with %.2f%% offered", i, a, res.Offered[i])
				}
			}
			waited := 0
			for _, w := range res.Waits {
				if w < 0 {
					t.Fatalf("a negative wait %s", w)
				}
				if w > 0 {
					waited++
				}
			}
			if tc.load < 0.5 && (waited > res.Placed/10 || res.StillPending > 0) {
				t.Errorf("at load %v, %d of %d placed pods waited and %d still wait", tc.load, waited, res.Placed, res.StillPending)
			}
			if tc.load > 0.9 && waited == 0 {
				t.Errorf("at load %v no pod waited", tc.load)
			}
			again, err := sim.RunDepartures(tCtx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(res.Waits, again.Waits); diff != "" {
				t.Errorf("same seed, other waits (-first,+second):\n%s", diff)
			}
		})
	}
	untimed := sim.DeparturesConfig{Nodes: cluster(), Tasks: tasks(), Seed: 7, Profile: "tessera-binpack", Load: 1}
	if _, err := sim.RunDepartures(tCtx, untimed); err == nil {
		t.Error("tasks without durations were accepted")
	}
}
