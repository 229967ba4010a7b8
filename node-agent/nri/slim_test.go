package nri

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// bigPod is a pod as a real workload's looks: large environments, probes,
// volumes, labels and a last-applied annotation, besides what the agent
// reads — GPU limits and an assignment for container main, a claim for
// container tools, a sidecar, Tessera's annotations.
func bigPod(i int) *v1.Pod {
	env := make([]v1.EnvVar, 40)
	for j := range env {
		env[j] = v1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: fmt.Sprintf("a-value-of-some-length-%d-%d", i, j)}
	}
	container := func(name string) v1.Container {
		return v1.Container{
			Name: name, Image: "registry.example.com/team/model-server:v1.2.3", Command: []string{"/bin/serve", "--port=8080", "--model=/models/m"},
			Env: env, VolumeMounts: []v1.VolumeMount{{Name: "models", MountPath: "/models"}, {Name: "cache", MountPath: "/cache"}},
			ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/ready"}}},
			Resources:      v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("16Gi")}},
		}
	}
	main, tools, proxy := container("main"), container("tools"), container("proxy")
	main.Resources.Limits["tessera.io/gpu-memory"] = resource.MustParse("8192")
	main.Resources.Limits["tessera.io/gpu-cores"] = resource.MustParse("30")
	tools.Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	proxy.RestartPolicy = ptr.To(v1.ContainerRestartPolicyAlways)
	assignment := fmt.Sprintf(`{"version":1,"containers":{"main":[{"index":%d,"uuid":"GPU-%d","memoryMiB":8192,"cores":30}]}}`, i%4, i%4)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprint("pod-", i), Namespace: "team", UID: types.UID(fmt.Sprint("uid-", i)), ResourceVersion: "12345",
			Labels: map[string]string{"app": "model-server", "team": "research", "version": "v1.2.3"},
			Annotations: map[string]string{
				gpuinfo.AssignmentAnnotation: assignment, gpuinfo.TaskPriorityAnnotation: "high",
				"kubectl.kubernetes.io/last-applied-configuration": string(make([]byte, 2048)),
			},
		},
		Spec: v1.PodSpec{
			NodeName: "node-1", Priority: ptr.To[int32](1000), ServiceAccountName: "server",
			InitContainers: []v1.Container{proxy}, Containers: []v1.Container{main, tools},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("claim")}},
			Volumes:        []v1.Volume{{Name: "models", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, {Name: "cache"}},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning, PodIP: "10.0.0.1", ResourceClaimStatuses: []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("claim")}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "main", ContainerID: "containerd://abc", Image: "registry.example.com/team/model-server:v1.2.3"}},
			Conditions:        []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
		},
	}
}

// TestSlimPodDecidesAlike: every container of a slimmed pod gets the same
// adjustment as of the whole pod, the pod's own checks included.
func TestSlimPodDecidesAlike(t *testing.T) {
	full := bigPod(1)
	slimmed, err := SlimPod(full)
	if err != nil {
		t.Fatal(err)
	}
	slim := slimmed.(*v1.Pod)
	node := enforce.Node{Name: "node-1", Cards: testCards()}
	reserve := allocatedClaim("claim", gpuinfo.DRADriver, 2, "pod-1")
	reserve.Status.ReservedFor[0].UID = full.UID
	node.Claims = func(string, string) (*resourceapi.ResourceClaim, error) { return reserve, nil }
	for _, ctr := range []string{"proxy", "main", "tools", "absent"} {
		for _, uid := range []string{"uid-1", "uid-2"} {
			want, wantErr := enforce.DefaultConfig().For(full, types.UID(uid), ctr, "ctr-1", node)
			got, gotErr := enforce.DefaultConfig().For(slim, types.UID(uid), ctr, "ctr-1", node)
			if diff := cmp.Diff(want, got); diff != "" || fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
				t.Errorf("container %s, sandbox %s: adjustment (-full,+slim):\n%s\nerrors %v, %v", ctr, uid, diff, wantErr, gotErr)
			}
		}
	}
	if len(slim.Spec.Containers[0].Env) != 0 || slim.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" {
		t.Errorf("the slim pod kept what the agent does not read: %+v", slim)
	}
}

// BenchmarkPodCache reports the heap a node's pod cache holds for 10,000
// pods like bigPod, decoded as an informer decodes them, whole and slimmed.
func BenchmarkPodCache(b *testing.B) {
	const pods = 10000
	raw := make([][]byte, pods)
	for i := range raw {
		raw[i], _ = json.Marshal(bigPod(i))
	}
	for _, tc := range []struct {
		name      string
		transform cache.TransformFunc
	}{{"whole", nil}, {"slim", SlimPod}} {
		b.Run(tc.name, func(b *testing.B) {
			var mib float64
			for range b.N {
				store := cache.NewStore(cache.MetaNamespaceKeyFunc)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for _, r := range raw {
					pod := &v1.Pod{}
					if err := json.Unmarshal(r, pod); err != nil {
						b.Fatal(err)
					}
					var obj any = pod
					if tc.transform != nil {
						obj, _ = tc.transform(pod)
					}
					_ = store.Add(obj)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				mib = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
				runtime.KeepAlive(store)
			}
			b.ReportMetric(mib, "MiB/10k-pods")
		})
	}
}
