package gpushare

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// mixedNode returns a harness with one node of n 80 GiB cards at mixed usage:
// a quarter of the cards empty, the others a quarter, half or fully used.
func mixedNode(b *testing.B, n int, args *config.GPUShareArgs) (*harness, *v1.Node) {
	inv := testutil.Inventory("n", "NVIDIA H100 80GB HBM3", 81920, n)
	node := testutil.GPUNode("n", inv)
	h := newHarness(b, args, node)
	for i, c := range inv.Cards {
		share := int64(i % 4)
		if share == 0 {
			continue
		}
		a := &gpuinfo.Assignment{Version: 1, Containers: map[string][]gpuinfo.CardAssignment{
			"c": {{Index: c.Index, UUID: c.UUID, MemoryMiB: 20480 * share, Cores: 25 * share}},
		}}
		h.plugin.ledger.AddPod(types.UID(fmt.Sprint("p", i)), "n", []gpuinfo.NamedContainer{{Name: "c"}}, a, false)
	}
	return h, node
}

func benchmarkPods() map[string]*v1.Pod {
	return map[string]*v1.Pod{
		"share":     gpuPod("share", testutil.Share(16384, 20)).Obj(),
		"two-cards": gpuPod("two", map[v1.ResourceName]string{"tessera.io/gpu": "2", "tessera.io/gpu-memory": "30000", "tessera.io/gpu-cores": "40"}).Obj(),
		"no-fit":    gpuPod("big", testutil.Share(90000, 10)).Obj(),
	}
}

// BenchmarkFilter measures Filter on one node; the framework calls it once
// per node per pod, from 16 goroutines.
func BenchmarkFilter(b *testing.B) {
	for _, cards := range []int{8, 16} {
		h, node := mixedNode(b, cards, nil)
		ni := nodeInfo(node)
		for name, pod := range benchmarkPods() {
			b.Run(fmt.Sprintf("cards=%d/pod=%s", cards, name), func(b *testing.B) {
				state := framework.NewCycleState()
				h.plugin.PreFilter(h.ctx, state, pod, nil)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = h.plugin.Filter(h.ctx, state, pod, ni)
				}
			})
		}
		b.Run(fmt.Sprintf("cards=%d/pod=share/parallel", cards), func(b *testing.B) {
			pod := benchmarkPods()["share"]
			state := framework.NewCycleState()
			h.plugin.PreFilter(h.ctx, state, pod, nil)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_ = h.plugin.Filter(h.ctx, state, pod, ni)
				}
			})
		})
	}
}

// BenchmarkScore measures Score on one node, for Binpack and for
// FragmentationAware with a learned workload of the most shapes it keeps
// (allocator.MaxShapes), its worst case.
func BenchmarkScore(b *testing.B) {
	for _, policy := range []config.Policy{config.PolicyBinpack, config.PolicyFragmentationAware} {
		for _, cards := range []int{8, 16} {
			h, node := mixedNode(b, cards, args(policy, policy))
			for i := 0; i < 4*allocator.MaxShapes; i++ {
				req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Count: 1 + i%2, Cores: int64(5 + i%95), MemoryPercent: int64(5 + i%95)}}}
				h.plugin.learner.Observe(fmt.Sprint(i), req, int64(1000*(1+i%7)))
			}
			ni := nodeInfo(node)
			pod := benchmarkPods()["share"]
			b.Run(fmt.Sprintf("policy=%s/cards=%d", policy, cards), func(b *testing.B) {
				state := framework.NewCycleState()
				h.plugin.PreFilter(h.ctx, state, pod, nil)
				h.plugin.PreScore(h.ctx, state, pod, nil)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_, _ = h.plugin.Score(h.ctx, state, pod, ni)
				}
			})
		}
	}
}

// BenchmarkReserve measures Reserve followed by Unreserve of the same pod.
func BenchmarkReserve(b *testing.B) {
	for _, cards := range []int{8, 16} {
		h, _ := mixedNode(b, cards, nil)
		pod := benchmarkPods()["share"]
		b.Run(fmt.Sprintf("cards=%d", cards), func(b *testing.B) {
			var state fwk.CycleState = framework.NewCycleState()
			h.plugin.PreFilter(h.ctx, state, pod, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if s := h.plugin.Reserve(h.ctx, state, pod, "n"); !s.IsSuccess() {
					b.Fatal(s)
				}
				h.plugin.Unreserve(h.ctx, state, pod, "n")
			}
		})
	}
}
