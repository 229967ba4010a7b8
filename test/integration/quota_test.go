package integration

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestResourceQuotaCapsGPUs: Kubernetes' own ResourceQuota on Tessera's
// resources caps what a namespace may ask for, refusing the pod that would
// exceed it with a message naming the quota; a zero quota on the percentage
// form closes the way around a MiB quota.
func TestResourceQuotaCapsGPUs(t *testing.T) {
	e := newEnv(t)
	e.node("a", "A100-80GB", 2, nil)
	e.startScheduler()
	hard := v1.ResourceList{
		"requests.tessera.io/gpu":                resource.MustParse("1"),
		"requests.tessera.io/gpu-memory":         resource.MustParse("20480"),
		"requests.tessera.io/gpu-memory-percent": resource.MustParse("0"),
	}
	quota, err := e.client.CoreV1().ResourceQuotas(e.ns).Create(e.tCtx, &v1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "team-gpus"},
		Spec:       v1.ResourceQuotaSpec{Hard: hard},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the quota controller (not running here) records first.
	used := v1.ResourceList{}
	for name := range hard {
		used[name] = resource.MustParse("0")
	}
	quota.Status = v1.ResourceQuotaStatus{Hard: hard, Used: used}
	if _, err := e.client.CoreV1().ResourceQuotas(e.ns).UpdateStatus(e.tCtx, quota, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The quota admission reads quotas from an informer: wait until it
	// refuses a dry run over the quota before counting on it.
	e.waitFor(30*time.Second, "quota team-gpus enforced", func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Create(e.tCtx, e.podSpec("probe", "tessera-binpack", map[string]int64{"tessera.io/gpu": 2}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "exceeded quota: team-gpus"), nil
	})

	e.create(e.podSpec("share", "tessera-binpack", map[string]int64{"tessera.io/gpu-memory": 16384, "tessera.io/gpu-cores": 20}))
	e.create(e.podSpec("card", "tessera-binpack", map[string]int64{"tessera.io/gpu": 1}))
	e.waitBound(30*time.Second, "share", "card")
	for _, tc := range []struct {
		name   string
		limits map[string]int64
		want   string
	}{
		{"more-memory", map[string]int64{"tessera.io/gpu-memory": 8192}, "requests.tessera.io/gpu-memory=8192"},
		{"another-card", map[string]int64{"tessera.io/gpu": 1}, "requests.tessera.io/gpu=1"},
		{"by-percent", map[string]int64{"tessera.io/gpu-memory-percent": 10}, "requests.tessera.io/gpu-memory-percent=10"},
	} {
		_, err := e.client.CoreV1().Pods(e.ns).Create(e.tCtx, e.podSpec(tc.name, "tessera-binpack", tc.limits), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "exceeded quota: team-gpus") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pod %s: %v; want a refusal naming quota team-gpus and %s", tc.name, err, tc.want)
		}
	}
}
