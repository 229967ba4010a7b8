package nri

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// gpuPod is a pod on node-1 whose container main holds the card uuid.
func gpuPod(name, uuid string) *v1.Pod {
	raw := fmt.Sprintf(`{"version":1,"containers":{"main":[{"index":0,"uuid":%q,"memoryMiB":4096,"cores":25}]}}`, uuid)
	p := st.MakePod().Name(name).Namespace("ns").UID("uid-"+name).Node("node-1").
		Annotation(gpuinfo.AssignmentAnnotation, raw).Obj()
	p.Spec.Containers = []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}}
	p.Spec.Containers[0].Resources.Limits["tessera.io/gpu-memory"] = mustQuantity("4096")
	p.Spec.Containers[0].Resources.Limits["tessera.io/gpu-cores"] = mustQuantity("25")
	return p
}

// TestNRIAgainstRuntime drives the plugin through NRI's own runtime side
// (pkg/adaptation) over its unix socket, as containerd would.
func TestNRIAgainstRuntime(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	socket := filepath.Join(dir, "nri.sock")

	pods := map[string]*v1.Pod{}
	for i := 0; i < 20; i++ {
		p := gpuPod(fmt.Sprint("p", i), fmt.Sprint("GPU-", i))
		pods[p.Name] = p
	}
	plain := st.MakePod().Name("plain").Namespace("ns").UID("uid-plain").Node("node-1").Container("main").Obj()
	pods["plain"] = plain
	missing := gpuPod("unassigned", "GPU-x")
	delete(missing.Annotations, gpuinfo.AssignmentAnnotation)
	pods["unassigned"] = missing
	var mu sync.Mutex
	getter := func(namespace, name string) (*v1.Pod, error) {
		mu.Lock()
		defer mu.Unlock()
		if p, ok := pods[name]; ok && namespace == "ns" {
			return p, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}

	runtime, err := nri.New("test-runtime", "v1", func(ctx context.Context, cb nri.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}, func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil },
		nri.WithSocketPath(socket), nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf")))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runtime.Stop)

	plugin := &Plugin{Node: "node-1", Names: gpuinfo.DefaultResourceNames(), Paths: enforce.DefaultPaths(), Pods: getter, PodWait: time.Second}
	ctx, cancel := context.WithCancel(tCtx)
	done := make(chan error, 1)
	go func() { done <- plugin.Run(ctx, socket) }()
	t.Cleanup(func() { cancel(); <-done })

	create := func(name, uid string) (*api.ContainerAdjustment, error) {
		resp, err := runtime.CreateContainer(tCtx, &api.CreateContainerRequest{
			Pod:       &api.PodSandbox{Id: "sb-" + name, Name: name, Namespace: "ns", Uid: uid},
			Container: &api.Container{Id: "ctr-" + name, PodSandboxId: "sb-" + name, Name: "main"},
		})
		if err != nil {
			return nil, err
		}
		return resp.GetAdjust(), nil
	}
	env := func(adj *api.ContainerAdjustment) map[string]string {
		m := map[string]string{}
		for _, kv := range adj.GetEnv() {
			m[kv.Key] = kv.Value
		}
		return m
	}
	// Wait until the plugin has registered: the runtime then adjusts.
	if err := wait.PollUntilContextTimeout(tCtx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		adj, err := create("p0", "uid-p0")
		return err == nil && env(adj)["NVIDIA_VISIBLE_DEVICES"] == "GPU-0", nil
	}); err != nil {
		t.Fatalf("the plugin never adjusted a container: %v", err)
	}

	// Many containers created at once each get their own pod's cards.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			adj, err := create(fmt.Sprint("p", i), fmt.Sprint("uid-p", i))
			if err != nil {
				errs <- err
				return
			}
			e := env(adj)
			if e["NVIDIA_VISIBLE_DEVICES"] != fmt.Sprint("GPU-", i) || e["CUDA_DEVICE_MEMORY_LIMIT_0"] != "4096m" || e["CUDA_DEVICE_SM_LIMIT_0"] != "25" {
				errs <- fmt.Errorf("pod p%d got %v", i, e)
			}
			if len(adj.GetMounts()) != 4 {
				errs <- fmt.Errorf("pod p%d got %d mounts, want 4", i, len(adj.GetMounts()))
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	if adj, err := create("plain", "uid-plain"); err != nil || len(adj.GetEnv()) != 0 || len(adj.GetMounts()) != 0 {
		t.Errorf("a container without GPUs was adjusted: %v, %v", adj, err)
	}
	if _, err := create("unassigned", "uid-unassigned"); err == nil || !strings.Contains(err.Error(), "has no tessera.io/gpu-assignment") {
		t.Errorf("a GPU container without an assignment was allowed: %v", err)
	}
	if _, err := create("p1", "uid-someone-else"); err == nil || !strings.Contains(err.Error(), "refusing to give GPUs") {
		t.Errorf("a sandbox with another UID got the pod's GPUs: %v", err)
	}
	if _, err := create("ghost", "uid-ghost"); err == nil || !strings.Contains(err.Error(), "pod not found in the API") {
		t.Errorf("a container of an unknown pod was allowed: %v", err)
	}
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
