package gpushare

import (
	"fmt"
	"math/rand"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// mixedNode returns a harness with one node of n 80 GiB cards at mixed usage
// — a quarter of the cards empty, the others a quarter, half or fully used —
// and its NodeInfo. The pods holding the cards are real bound pods, in the
// API, the ledger and the NodeInfo alike, so that no Filter finds them
// missing and drops them.
func mixedNode(b *testing.B, n int, args *config.GPUShareArgs) (*harness, fwk.NodeInfo) {
	inv := testutil.Inventory("n", "NVIDIA H100 80GB HBM3", 81920, n)
	node := testutil.GPUNode("n", inv)
	objs := []runtime.Object{node}
	var pods []*v1.Pod
	for i, c := range inv.Cards {
		share := int64(i % 4)
		if share == 0 {
			continue
		}
		p := boundPod(fmt.Sprint("p", i), "n", map[string][]gpuinfo.CardAssignment{
			"c": {{Index: c.Index, UUID: c.UUID, MemoryMiB: 20480 * share, Cores: 25 * share}},
		})
		objs, pods = append(objs, p), append(pods, p)
	}
	h := newHarness(b, args, objs...)
	if got := len(h.plugin.ledger.BoundPods("n")); got != len(pods) {
		b.Fatalf("the ledger holds %d pods, want %d", got, len(pods))
	}
	ni := framework.NewNodeInfo(pods...)
	ni.SetNode(node)
	return h, ni
}

// checkStillHeld fails the benchmark if Filter dropped the node's pods from
// the ledger, which would leave later runs measuring an emptier node.
func checkStillHeld(b *testing.B, h *harness, ni fwk.NodeInfo) {
	if got, want := len(h.plugin.ledger.BoundPods("n")), len(ni.GetPods()); got != want {
		b.Fatalf("the ledger holds %d of the node's %d pods after the run", got, want)
	}
}

// benchmarkPod is a pod the benchmarks place, with its name in their output.
type benchmarkPod struct {
	name string
	pod  *v1.Pod
}

func benchmarkPods() []benchmarkPod {
	return []benchmarkPod{
		{"share", gpuPod("share", testutil.Share(16384, 20)).Obj()},
		{"two-cards", gpuPod("two", map[v1.ResourceName]string{"tessera.io/gpu": "2", "tessera.io/gpu-memory": "30000", "tessera.io/gpu-cores": "40"}).Obj()},
		{"no-fit", gpuPod("big", testutil.Share(90000, 10)).Obj()},
	}
}

// BenchmarkFilter measures Filter on one node; the framework calls it once
// per node per pod, from 16 goroutines.
func BenchmarkFilter(b *testing.B) {
	for _, cards := range []int{8, 16} {
		h, ni := mixedNode(b, cards, nil)
		for _, bp := range benchmarkPods() {
			pod := bp.pod
			b.Run(fmt.Sprintf("cards=%d/pod=%s", cards, bp.name), func(b *testing.B) {
				state := framework.NewCycleState()
				h.plugin.PreFilter(h.ctx, state, pod, nil)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = h.plugin.Filter(h.ctx, state, pod, ni)
				}
				b.StopTimer()
				checkStillHeld(b, h, ni)
			})
		}
		b.Run(fmt.Sprintf("cards=%d/pod=share/parallel", cards), func(b *testing.B) {
			pod := benchmarkPods()[0].pod
			state := framework.NewCycleState()
			h.plugin.PreFilter(h.ctx, state, pod, nil)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_ = h.plugin.Filter(h.ctx, state, pod, ni)
				}
			})
			b.StopTimer()
			checkStillHeld(b, h, ni)
		})
	}
}

// BenchmarkScore measures Score on one node, for Binpack and for
// FragmentationAware with a learned workload of the most shapes it keeps
// (allocator.MaxShapes), its worst case; for Binpack also after Filter, as
// the framework runs it.
func BenchmarkScore(b *testing.B) {
	for _, policy := range []config.Policy{config.PolicyBinpack, config.PolicyFragmentationAware} {
		for _, cards := range []int{8, 16} {
			h, ni := mixedNode(b, cards, args(policy, policy))
			for i := 0; i < 4*allocator.MaxShapes; i++ {
				req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Count: 1 + i%2, Cores: int64(5 + i%95), MemoryPercent: int64(5 + i%95)}}}
				h.plugin.learner.Observe(fmt.Sprint(i), req, int64(1000*(1+i%7)))
			}
			pod := benchmarkPods()[0].pod
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
			if policy != config.PolicyBinpack {
				continue
			}
			// As the framework runs it: Filter first, whose placement Score
			// takes from the node's score slot.
			b.Run(fmt.Sprintf("policy=%s/cards=%d/after-filter", policy, cards), func(b *testing.B) {
				state := framework.NewCycleState()
				h.plugin.PreFilter(h.ctx, state, pod, nil)
				if s := h.plugin.Filter(h.ctx, state, pod, ni); !s.IsSuccess() {
					b.Fatal(s)
				}
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
		pod := benchmarkPods()[0].pod
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

// BenchmarkRecordLookup looks up the records of 500 of 5,000 nodes, in a
// shuffled order as Filter and Score visit them, by name and by the node
// object. One op is the 500 lookups.
func BenchmarkRecordLookup(b *testing.B) {
	var r nodeRecords
	const nodes = 5000
	objects := make([]*v1.Node, nodes)
	for i := range objects {
		objects[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i)}}
		r.track(objects[i])
	}
	visit := rand.New(rand.NewSource(1)).Perm(nodes)[:500]
	b.Run("by name", func(b *testing.B) {
		for b.Loop() {
			for _, i := range visit {
				_ = r.get(objects[i].Name)
			}
		}
	})
	b.Run("by object", func(b *testing.B) {
		for b.Loop() {
			for _, i := range visit {
				_ = r.lookup(objects[i])
			}
		}
	})
}
