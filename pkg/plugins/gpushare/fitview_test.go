package gpushare

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestNodeResourcesFitSeesNoGPUResources runs kube-scheduler's own
// NodeResourcesFit, configured to ignore nothing, before GPUShare's
// PreFilter, as a profile does, on a node that advertises eight cards but
// no per-card resources. NodeResourcesFit's Filter then passes a shared-card
// pod and still checks everything else the pod asks for (CPU), and GPUShare's
// Filter checks the card count in its stead with NodeResourcesFit's own
// verdict — the reference is NodeResourcesFit's Filter without GPUShare's
// PreFilter, which also shows what the narrowing changes: without it the
// shares fail on the per-card resources. The one intended difference: on a
// node that does not advertise the card count at all (an agent without its
// device plugin) GPUShare does not check it, as kubelet does not, where
// NodeResourcesFit would reject every pod asking for whole cards.
func TestNodeResourcesFitSeesNoGPUResources(t *testing.T) {
	names := gpuinfo.DefaultResourceNames()
	node := st.MakeNode().Name("n").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "4", v1.ResourceMemory: "8Gi", v1.ResourcePods: "10", names.GPU: "8",
	}).Annotation(gpuinfo.InventoryAnnotation, testutil.MustEncode(testutil.Inventory("n", "Tesla T4", 16384, 8))).Obj()
	h := newHarness(t, nil, node)
	unadvertised := node.DeepCopy()
	delete(unadvertised.Status.Capacity, names.GPU)
	delete(unadvertised.Status.Allocatable, names.GPU)
	args := &schedconfig.NodeResourcesFitArgs{ScoringStrategy: &schedconfig.ScoringStrategy{
		Type: schedconfig.LeastAllocated, Resources: []schedconfig.ResourceSpec{{Name: "cpu", Weight: 1}},
	}}
	pl, err := noderesources.NewFit(h.ctx, args, h.plugin.handle, feature.Features{})
	if err != nil {
		t.Fatal(err)
	}
	fit := pl.(interface {
		fwk.PreFilterPlugin
		fwk.FilterPlugin
	})
	pod := func(name string, req map[v1.ResourceName]string) *v1.Pod {
		return st.MakePod().Name(name).Namespace("default").UID(name).Req(req).Obj()
	}
	withInit := pod("init", map[v1.ResourceName]string{v1.ResourceCPU: "1"})
	withInit.Spec.InitContainers = []v1.Container{{Name: "warmup", Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{names.Memory: resource.MustParse("4096")}, Limits: v1.ResourceList{names.Memory: resource.MustParse("4096")},
	}}}
	initCards := pod("init-cards", map[v1.ResourceName]string{names.GPU: "1"})
	initCards.Spec.InitContainers = []v1.Container{{Name: "warmup", Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{names.GPU: resource.MustParse("3")}, Limits: v1.ResourceList{names.GPU: resource.MustParse("3")},
	}}}
	// Six of the node's eight cards are requested by a pod already there.
	holder := pod("holder", map[v1.ResourceName]string{names.GPU: "6"})
	holder.Spec.NodeName = "n"
	perCard := []string{"Insufficient " + string(names.Memory), "Insufficient " + string(names.MemoryPercent), "Insufficient " + string(names.Cores)}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		// held puts the holder on the node.
		held bool
		// unadvertised puts the pod on the node object without the count.
		unadvertised bool
	}{
		{name: "percent share", pod: pod("percent", map[v1.ResourceName]string{v1.ResourceCPU: "1", names.MemoryPercent: "50", names.Cores: "50"})},
		{name: "memory share", pod: pod("mib", map[v1.ResourceName]string{v1.ResourceCPU: "1", names.Memory: "4096"})},
		{name: "init container share", pod: withInit},
		{name: "share and too much CPU", pod: pod("cpu", map[v1.ResourceName]string{v1.ResourceCPU: "8", names.MemoryPercent: "50"})},
		{name: "cards fit", pod: pod("two", map[v1.ResourceName]string{names.GPU: "2"}), held: true},
		{name: "cards taken", pod: pod("three", map[v1.ResourceName]string{names.GPU: "3"}), held: true},
		{name: "more cards than advertised", pod: pod("nine", map[v1.ResourceName]string{names.GPU: "9"})},
		{name: "init container's cards count", pod: initCards, held: true},
		{name: "cards and too much CPU", pod: pod("both", map[v1.ResourceName]string{v1.ResourceCPU: "8", names.GPU: "9"})},
		{name: "cards on a node that advertises none", pod: pod("unadvertised", map[v1.ResourceName]string{names.GPU: "2"}), unadvertised: true},
		{name: "cards and too much CPU on a node that advertises none", pod: pod("unadvertised-cpu", map[v1.ResourceName]string{v1.ResourceCPU: "8", names.GPU: "2"}), unadvertised: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			ni := framework.NewNodeInfo()
			if tc.held {
				ni = framework.NewNodeInfo(holder)
			}
			if tc.unadvertised {
				ni.SetNode(unadvertised)
			} else {
				ni.SetNode(node)
			}
			// The reference: NodeResourcesFit's verdict without GPUShare,
			// less the per-card resources no node advertises. Where it
			// still rejects for CPU, the framework stops there and GPUShare
			// is not asked; otherwise GPUShare gives the card count's.
			state := framework.NewCycleState()
			if _, status := fit.PreFilter(h.ctx, state, tc.pod, nil); !status.IsSuccess() {
				t.Fatal(status)
			}
			reference := fit.Filter(h.ctx, state, tc.pod, ni)
			var reasons []string
			if reference != nil {
				reasons = reference.Reasons()
			}
			reasons = slices.DeleteFunc(slices.Clone(reasons), func(r string) bool {
				return slices.Contains(perCard, r) || tc.unadvertised && r == "Insufficient "+string(names.GPU)
			})
			if others := slices.DeleteFunc(slices.Clone(reasons), func(r string) bool { return r == "Insufficient "+string(names.GPU) }); len(others) > 0 {
				reasons = others
			}
			var want string
			if len(reasons) > 0 {
				want = reference.Code().String() + ": " + strings.Join(reasons, "; ")
			}
			state = framework.NewCycleState()
			if _, status := fit.PreFilter(h.ctx, state, tc.pod, nil); !status.IsSuccess() {
				t.Fatal(status)
			}
			if _, status := h.plugin.PreFilter(h.ctx, state, tc.pod, nil); !status.IsSuccess() {
				t.Fatal(status)
			}
			got := verdict(fit.Filter(h.ctx, state, tc.pod, ni))
			if strings.Contains(got, "tessera.io/") {
				t.Errorf("NodeResourcesFit still checks a GPUShare resource: %q", got)
			}
			if got == "" {
				got = verdict(h.plugin.Filter(h.ctx, state, tc.pod, ni))
			}
			if got != want {
				t.Errorf("with GPUShare's PreFilter: %q; want NodeResourcesFit's own %q", got, want)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("the scheduler's pod object changed (-want,+got):\n%s", diff)
			}
		})
	}
}

// verdict is a Filter status as code and reasons, "" for success.
func verdict(status *fwk.Status) string {
	if status.IsSuccess() {
		return ""
	}
	return status.Code().String() + ": " + strings.Join(status.Reasons(), "; ")
}
