package gpushare

import (
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
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestNodeResourcesFitSeesNoPerCardResources runs kube-scheduler's own
// NodeResourcesFit, configured to ignore nothing, before GPUShare's
// PreFilter, as a profile does: its Filter then passes a shared-card pod on a
// node that advertises no per-card resources, and still checks everything
// else the pod asks for (CPU, the card count). Without GPUShare's PreFilter
// the same pods fail on the per-card resources, which shows what the
// narrowing changes.
func TestNodeResourcesFitSeesNoPerCardResources(t *testing.T) {
	h := newHarness(t, nil)
	names := gpuinfo.DefaultResourceNames()
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
	node := st.MakeNode().Name("n").Capacity(map[v1.ResourceName]string{
		v1.ResourceCPU: "4", v1.ResourceMemory: "8Gi", v1.ResourcePods: "10", names.GPU: "8",
	}).Obj()
	share := func(name string, cpu string, extra map[v1.ResourceName]string) *v1.Pod {
		req := map[v1.ResourceName]string{v1.ResourceCPU: cpu}
		for k, v := range extra {
			req[k] = v
		}
		return st.MakePod().Name(name).Namespace("default").UID(name).Req(req).Obj()
	}
	withInit := share("init", "1", nil)
	withInit.Spec.InitContainers = []v1.Container{{Name: "warmup", Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{names.Memory: resource.MustParse("4096")}, Limits: v1.ResourceList{names.Memory: resource.MustParse("4096")},
	}}}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		// want is the Filter's reason with GPUShare's PreFilter run ("" for
		// none); without is its reason without.
		want, without string
	}{
		{name: "percent share", pod: share("percent", "1", map[v1.ResourceName]string{names.MemoryPercent: "50", names.Cores: "50"}),
			without: "Insufficient " + string(names.Cores)},
		{name: "memory share", pod: share("mib", "1", map[v1.ResourceName]string{names.Memory: "4096"}),
			without: "Insufficient " + string(names.Memory)},
		{name: "init container share", pod: withInit, without: "Insufficient " + string(names.Memory)},
		{name: "share and too much CPU", pod: share("cpu", "8", map[v1.ResourceName]string{names.MemoryPercent: "50"}),
			want: "Insufficient cpu", without: "Insufficient cpu"},
		{name: "more cards than advertised", pod: share("cards", "1", map[v1.ResourceName]string{names.GPU: "9"}),
			want: "Insufficient " + string(names.GPU), without: "Insufficient " + string(names.GPU)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			defer func() {
				if diff := cmp.Diff(before, tc.pod); diff != "" {
					t.Errorf("the scheduler's pod object changed (-want,+got):\n%s", diff)
				}
			}()
			for _, narrowed := range []bool{true, false} {
				state := framework.NewCycleState()
				if _, status := fit.PreFilter(h.ctx, state, tc.pod, nil); !status.IsSuccess() {
					t.Fatal(status)
				}
				want := tc.without
				if narrowed {
					want = tc.want
					if _, status := h.plugin.PreFilter(h.ctx, state, tc.pod, nil); !status.IsSuccess() {
						t.Fatal(status)
					}
				}
				status := fit.Filter(h.ctx, state, tc.pod, nodeInfo(node))
				var got string
				if status != nil {
					got = strings.Join(status.Reasons(), "; ")
				}
				if !strings.Contains(got, want) || (want == "") != status.IsSuccess() {
					t.Errorf("narrowed %v: NodeResourcesFit Filter = %v; want reason %q", narrowed, status, want)
				}
			}
		})
	}
}
