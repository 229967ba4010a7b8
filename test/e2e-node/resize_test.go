//go:build e2enode

package e2enode

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/hamicore"
	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
)

// TestResizeRunningContainer: a running container's share is shrunk by a
// GPUShareResize through the scheduler's resize controller and the agent
// process: the limit in the container's shared region — initialised here as
// HAMi-core would, which cannot be built on this machine — changes in the
// file the agent mounted, and a process of the container reads the new
// limit through its own mount; the pod's assignment records the new share.
func TestResizeRunningContainer(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := schedule(tCtx, podSpec(ns, "notebook", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 30}}))["notebook"]
	r := startContainer(tCtx, runSandbox(tCtx, pod, ""), pod, "main")
	hostRegion := filepath.Join(vgpuDir(), "cache", r.region())
	if err := hamicore.WriteRegion(hostRegion, 1, 2, []uint64{8192 << 20}, []uint64{30}, nil); err != nil {
		t.Fatal(err)
	}
	client, err := dynamic.NewForConfig(suite.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	resizes := client.Resource(v1alpha1.Resource).Namespace(ns)
	if _, err := resizes.Create(tCtx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.Resource.GroupVersion().String(), "kind": v1alpha1.Kind,
		"metadata": map[string]any{"name": "idle"},
		"spec":     map[string]any{"podName": "notebook", "container": "main", "memory": "4Gi", "cores": int64(20)},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var applied *metav1.Condition
	err = wait.PollUntilContextTimeout(tCtx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := resizes.Get(ctx, "idle", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got := &v1alpha1.GPUShareResize{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, got); err != nil {
			return false, err
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionRefused); c != nil && c.Status == metav1.ConditionTrue {
			return false, fmt.Errorf("refused (%s): %s", c.Reason, c.Message)
		}
		applied = meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionApplied)
		return applied != nil && applied.Status == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("the resize: %v", err)
	}
	// The host's file, and the container's view of it through its mount.
	for what, path := range map[string]string{
		"the host's region":                       hostRegion,
		"the region the container's process sees": fmt.Sprintf("/proc/%d/root/usr/local/vgpu/cache/%s", r.pid, r.region()),
	} {
		memory, compute, err := hamicore.RegionLimits(path, 0)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if memory != 4096<<20 || compute != 20 {
			t.Errorf("%s: limits %d MiB and %d%%, want 4096 MiB and 20%%", what, memory>>20, compute)
		}
	}
	got, err := suite.cp.Client.CoreV1().Pods(ns).Get(tCtx, "notebook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if card := cardsOf(tCtx, got, "main")[0]; card.MemoryMiB != 4096 || card.Cores != 20 {
		t.Errorf("the pod's assignment after the resize: %d MiB and %d%%, want 4096 MiB and 20%%", card.MemoryMiB, card.Cores)
	}
}
