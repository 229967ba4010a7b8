package allocator_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func pct(p int64) gpuinfo.ContainerRequest {
	return gpuinfo.ContainerRequest{Name: "c", Count: 1, Cores: p, MemoryPercent: p}
}

func only(c gpuinfo.ContainerRequest, cpu int64) *allocator.Workload {
	return &allocator.Workload{Shapes: []allocator.Shape{{Weight: 1, CPUMilli: cpu, Container: c}}}
}

// used returns per-card usage on 16 GiB cards, in percent of each.
func usedPct(ps ...int64) []allocator.Usage {
	u := make([]allocator.Usage, 4)
	for i, p := range ps {
		u[i] = allocator.Usage{MemoryMiB: 16384 * p / 100, Cores: p}
	}
	return u
}

func TestFragmentationAwarePlacement(t *testing.T) {
	wholeCard := gpuinfo.ContainerRequest{Count: 1, Cores: gpuinfo.FullCores}
	tests := []struct {
		name      string
		used      []allocator.Usage
		req       gpuinfo.ContainerRequest
		workload  *allocator.Workload
		policy    allocator.Policy
		wantCard  int
		wantDelta float64
	}{
		{
			// 40 % is left, too little for the half-card requests the
			// workload is made of.
			name:      "the only card left",
			used:      usedPct(40, 100, 100, 100),
			req:       pct(20),
			workload:  only(pct(50), 0),
			policy:    allocator.FragmentationAware,
			wantCard:  0,
			wantDelta: 400,
		},
		{
			name:      "binpack on the same node strands 40 %",
			used:      usedPct(40, 0, 100, 100),
			req:       pct(20),
			workload:  only(pct(50), 0),
			policy:    allocator.Binpack,
			wantCard:  0,
			wantDelta: 400,
		},
		{
			name:      "fragmentation-aware takes the empty card there",
			used:      usedPct(40, 0, 100, 100),
			req:       pct(20),
			workload:  only(pct(50), 0),
			policy:    allocator.FragmentationAware,
			wantCard:  1,
			wantDelta: 0,
		},
		{
			// A share on an empty card strands the rest of it for whole-card
			// requests; on the partly used card it strands less.
			name:      "whole-card workload: shares go to used cards",
			used:      usedPct(70, 0, 0, 100),
			req:       pct(25),
			workload:  only(wholeCard, 0),
			policy:    allocator.FragmentationAware,
			wantCard:  0,
			wantDelta: -250,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cards, _ := fourCards()
			req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{tc.req}}
			a := &gpuinfo.Assignment{Containers: map[string][]gpuinfo.CardAssignment{}}
			out := allocator.Place(cards, tc.used, nil, req, allocator.Strategy{Policy: tc.policy, Workload: tc.workload, CPUFreeMilli: 1000}, a)
			if !out.Fits {
				t.Fatalf("does not fit: %+v", out.Failure)
			}
			if got := a.Containers["c"][0].Index; got != tc.wantCard {
				t.Errorf("card %d, want %d", got, tc.wantCard)
			}
			if math.Abs(out.FragmentationDelta-tc.wantDelta) > 1e-9 {
				t.Errorf("fragmentation delta %v, want %v", out.FragmentationDelta, tc.wantDelta)
			}
		})
	}
}

// Filter places without a workload (as Binpack) and Reserve with one: a pod
// must fit in both or neither.
func TestFragmentationAwareFitsLikeBinpack(t *testing.T) {
	cards, _ := fourCards()
	w := only(pct(50), 0)
	for _, used := range [][]allocator.Usage{usedPct(40, 90, 100, 100), usedPct(100, 100, 100, 100), usedPct(10, 20, 30, 40)} {
		for _, p := range []int64{5, 50, 70, 100} {
			req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{pct(p)}}
			filter := allocator.Place(cards, used, nil, req, allocator.Strategy{Policy: allocator.FragmentationAware}, nil)
			reserve := allocator.Place(cards, used, nil, req, allocator.Strategy{Policy: allocator.FragmentationAware, Workload: w}, nil)
			if filter.Fits != reserve.Fits {
				t.Errorf("used %v, %d%%: Filter fits %v, Reserve fits %v", used, p, filter.Fits, reserve.Fits)
			}
		}
	}
}

func TestPlaceWithoutGPU(t *testing.T) {
	cards, _ := fourCards()
	halfCards := only(pct(50), 4000)
	wholeCards := only(gpuinfo.ContainerRequest{Count: 1, Cores: gpuinfo.FullCores}, 4000)
	tests := []struct {
		name          string
		used          []allocator.Usage
		workload      *allocator.Workload
		cpuFree, take int64
		want          float64
	}{
		{"CPU left for the workload", usedPct(50, 100, 100, 100), halfCards, 8000, 1000, 0},
		// Below 4000 m the half-card requests cannot land: card 0's free half
		// is stranded.
		{"CPU exhausted strands the free GPU", usedPct(50, 100, 100, 100), halfCards, 4500, 1000, 500},
		// Three free cards hold six half-card requests. 16000 m reaches four
		// of them (1000 per mille stranded), 12000 m three (1500).
		{"CPU running short strands a share shape's GPU", usedPct(0, 0, 0, 100), halfCards, 16000, 4000, 500},
		// 28000 m still reaches seven requests, more than the cards hold.
		{"CPU to spare for every share", usedPct(0, 0, 0, 100), halfCards, 32000, 4000, 0},
		// Whole-card requests keep the free-card measure: one more still
		// fits after 8000 m is left.
		{"whole-card shapes count free cards only", usedPct(0, 0, 0, 100), wholeCards, 12000, 4000, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := allocator.PlaceWithoutGPU(cards, tc.used, allocator.Strategy{Workload: tc.workload, CPUFreeMilli: tc.cpuFree, CPUMilli: tc.take})
			if diff := cmp.Diff(tc.want, out.FragmentationDelta); diff != "" {
				t.Errorf("fragmentation delta (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestFragmentation: the measure metrics report. Shape: half a card. Cards
// used 60%, 30%, 0%, 100% leave 40%, 70%, 100%, 0% free; only the 40% card
// cannot take the shape, so 400 of the 2100 per mille free is fragmented.
// Without a workload nothing is fragmented.
func TestFragmentation(t *testing.T) {
	cards, _ := fourCards()
	used := usedPct(60, 30, 0, 100)
	fragmented, free := allocator.Fragmentation(only(pct(50), 0), cards, used)
	if fragmented != 400 || free != 2100 {
		t.Errorf("Fragmentation = %v of %v per mille, want 400 of 2100", fragmented, free)
	}
	if fragmented, free := allocator.Fragmentation(nil, cards, used); fragmented != 0 || free != 2100 {
		t.Errorf("Fragmentation without a workload = %v of %v, want 0 of 2100", fragmented, free)
	}
}

func TestWeighByScarcity(t *testing.T) {
	anywhere := allocator.Shape{Weight: 0.5, Container: gpuinfo.ContainerRequest{Count: 1, Cores: 100}}
	onlyT4 := allocator.Shape{Weight: 0.25, Container: gpuinfo.ContainerRequest{Count: 1, Cores: 100}, Selector: gpuinfo.Selector{Models: []string{"t4"}}}
	notT4 := allocator.Shape{Weight: 0.25, Container: gpuinfo.ContainerRequest{Count: 1, Cores: 100}, Selector: gpuinfo.Selector{ExcludeModels: []string{"t4"}}}
	fleet := map[string]int{"tesla t4": 2, "a100": 6}
	// T4 cards are 2 of 8: the T4-only shape weighs 4×; cards other than
	// T4 are 6 of 8: the other constrained shape weighs 4/3×; then the
	// weights sum to 1 again (0.5 + 1 + 1/3).
	sum := 0.5 + 0.25*4 + 0.25*4.0/3
	for _, tc := range []struct {
		name  string
		in    *allocator.Workload
		fleet map[string]int
		want  []float64
	}{
		{"constrained shapes weighed", &allocator.Workload{Shapes: []allocator.Shape{anywhere, onlyT4, notT4}}, fleet, []float64{0.5 / sum, 1 / sum, 0.25 * 4 / 3 / sum}},
		{"no constrained shape", &allocator.Workload{Shapes: []allocator.Shape{anywhere, anywhere}}, fleet, []float64{0.5, 0.5}},
		{"no cards", &allocator.Workload{Shapes: []allocator.Shape{anywhere, onlyT4}}, nil, []float64{0.5, 0.25}},
		{"no matching card", &allocator.Workload{Shapes: []allocator.Shape{anywhere, onlyT4}}, map[string]int{"a100": 4}, []float64{0.5 / 0.75, 0.25 / 0.75}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.WeighByScarcity(tc.fleet)
			var weights []float64
			for _, s := range got.Shapes {
				weights = append(weights, s.Weight)
			}
			if diff := cmp.Diff(tc.want, weights, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("weights (-want,+got):\n%s", diff)
			}
			if tc.in.Shapes[0].Weight != anywhere.Weight {
				t.Error("the learned workload was changed")
			}
		})
	}
}
