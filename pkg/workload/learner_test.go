package workload_test

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/workload"
)

func sharePct(p int64) *gpuinfo.PodRequest {
	return &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, Cores: p, MemoryPercent: p}}}
}

// weightOf sums the weight of shapes with the given per-card cores.
func weightOf(w *allocator.Workload, cores int64, count int) float64 {
	var sum float64
	for _, s := range w.Shapes {
		if s.Container.Cores == cores && s.Container.Count == count {
			sum += s.Weight
		}
	}
	return sum
}

func checkNormalised(t *testing.T, w *allocator.Workload) {
	t.Helper()
	var sum float64
	for _, s := range w.Shapes {
		sum += s.Weight
	}
	if math.Abs(sum-1) > 1e-9 || len(w.Shapes) > allocator.MaxShapes {
		t.Fatalf("workload of %d shapes with weights summing to %v", len(w.Shapes), sum)
	}
}

func TestLearnerStartsFromThePrior(t *testing.T) {
	w := workload.NewLearner(workload.DefaultHalfLife).Workload()
	checkNormalised(t, w)
	if len(w.Shapes) != len(workload.Prior) {
		t.Fatalf("%d shapes, want the prior's %d", len(w.Shapes), len(workload.Prior))
	}
}

func TestLearnerFollowsTheRequests(t *testing.T) {
	l := workload.NewLearner(500)
	for i := 0; i < 2000; i++ {
		l.Observe(fmt.Sprint("share-", i), sharePct(30), 3000)
	}
	w := l.Workload()
	checkNormalised(t, w)
	if got := weightOf(w, 30, 1); got < 0.9 {
		t.Fatalf("30%% share weighs %.3f after 2000 observations of it, want most of the mix", got)
	}
	if cpu := w.Shapes[0].CPUMilli; cpu != 3000 {
		t.Errorf("heaviest shape's CPU %d, want 3000", cpu)
	}
	// The workload shifts to whole cards; with a half-life of 500 requests
	// the old shape fades.
	whole := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "a", Count: 2, Cores: gpuinfo.FullCores}, {Name: "b", Count: 1, Cores: gpuinfo.FullCores}}}
	for i := 0; i < 2000; i++ {
		l.Observe(fmt.Sprint("whole-", i), whole, 16000)
	}
	w = l.Workload()
	if got, old := weightOf(w, gpuinfo.FullCores, 3), weightOf(w, 30, 1); got < 0.9 || old > 0.1 {
		t.Fatalf("after the shift: 3 whole cards weigh %.3f, the old share %.3f", got, old)
	}
}

func TestLearnerCountsAPodOnce(t *testing.T) {
	l := workload.NewLearner(workload.DefaultHalfLife)
	for i := 0; i < 1000; i++ {
		l.Observe("retried", sharePct(30), 1000)
	}
	if got := weightOf(l.Workload(), 30, 1); got > 0.5 {
		t.Errorf("one pod observed 1000 times weighs %.3f against a prior worth 10 pods", got)
	}
	l.Forget("retried")
	l.Observe("retried", sharePct(30), 1000)
	if got := weightOf(l.Workload(), 30, 1); got < 0.1 {
		t.Errorf("a forgotten pod observed again weighs %.3f, want it counted", got)
	}
}

func TestLearnerKeepsTheHeaviestShapes(t *testing.T) {
	l := workload.NewLearner(workload.DefaultHalfLife)
	for p := int64(1); p < 100; p++ {
		for i := int64(0); i < p; i++ {
			l.Observe(fmt.Sprint(p, "-", i), sharePct(p), 1000)
		}
	}
	w := l.Workload()
	checkNormalised(t, w)
	if len(w.Shapes) != allocator.MaxShapes {
		t.Fatalf("%d shapes, want %d", len(w.Shapes), allocator.MaxShapes)
	}
	if w.Shapes[0].Container.Cores != 99 {
		t.Errorf("heaviest shape is %d%%, want the most observed, 99%%", w.Shapes[0].Container.Cores)
	}
}

func TestLearnerConcurrentUse(t *testing.T) {
	l := workload.NewLearner(100)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				l.Observe(fmt.Sprint(g, "-", i), sharePct(int64(1+(g*7+i)%99)), 1000)
				checkNormalised(t, l.Workload())
			}
		}()
	}
	wg.Wait()
}

// TestMemoryOnlyRequestsWeigh: requests that ask memory and no compute
// (cores 0, allowed by the contract) weigh by the memory they hold; a
// workload of nothing else stays a distribution.
func TestMemoryOnlyRequestsWeigh(t *testing.T) {
	memory := func(mib int64) *gpuinfo.PodRequest {
		return &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: mib}}}
	}
	l := workload.NewLearner(10)
	for i := 0; i < 500; i++ { // the prior fades entirely
		l.Observe(fmt.Sprint("small-", i), memory(4096), 1000)
		l.Observe(fmt.Sprint("large-", i), memory(40960), 1000)
	}
	w := l.Workload()
	checkNormalised(t, w)
	var small, large float64
	for _, s := range w.Shapes {
		if math.IsNaN(s.Weight) || s.Weight < 0 {
			t.Fatalf("shape %+v weighs %v", s.Container, s.Weight)
		}
		switch s.Container.MemoryMiB {
		case 4096:
			small += s.Weight
		case 40960:
			large += s.Weight
		}
	}
	if small <= 0 || large <= small {
		t.Errorf("equally frequent 4 GiB and 40 GiB memory-only requests weigh %.3f and %.3f; want both above 0, the larger more", small, large)
	}
}
