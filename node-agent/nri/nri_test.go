package nri

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	"github.com/google/go-cmp/cmp"
	rgen "github.com/opencontainers/runtime-tools/generate"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// testCards are node-1's cards: GPU-i at index i, 80 GiB each.
func testCards() []discovery.Card {
	var cards []discovery.Card
	for i := range 20 {
		cards = append(cards, discovery.Card{Index: i, Minor: i, UUID: fmt.Sprint("GPU-", i), MemoryMiB: 81920, Healthy: true})
	}
	return cards
}

// gpuPod is a pod on node-1 whose container main holds 4096 MiB and 25 %
// of card GPU-<index>.
func gpuPod(name string, index int) *v1.Pod {
	return sharePod(name, index, 4096, 25)
}

// sharePod is a pod on node-1 whose container main holds memory MiB and
// cores % of card GPU-<index>.
func sharePod(name string, index int, memory, cores int64) *v1.Pod {
	raw := fmt.Sprintf(`{"version":1,"containers":{"main":[{"index":%d,"uuid":"GPU-%d","memoryMiB":%d,"cores":%d}]}}`, index, index, memory, cores)
	p := st.MakePod().Name(name).Namespace("ns").UID("uid-"+name).Node("node-1").
		Annotation(gpuinfo.AssignmentAnnotation, raw).Obj()
	p.Spec.Containers = []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}}
	p.Spec.Containers[0].Resources.Limits["tessera.io/gpu-memory"] = *resource.NewQuantity(memory, resource.DecimalSI)
	if cores > 0 {
		p.Spec.Containers[0].Resources.Limits["tessera.io/gpu-cores"] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return p
}

// podMap is a pod getter over a fixed set of pods in namespace ns.
func podMap(pods ...*v1.Pod) PodGetter {
	var mu sync.Mutex
	byName := map[string]*v1.Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	return func(namespace, name string) (*v1.Pod, error) {
		mu.Lock()
		defer mu.Unlock()
		if p, ok := byName[name]; ok && namespace == "ns" {
			return p, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}
}

// runtimeSide is NRI's own runtime side (pkg/adaptation) serving a socket,
// as containerd does, with NRI's default request timeout in force.
type runtimeSide struct {
	*nri.Adaptation
	t *testing.T
}

// startRuntime starts the runtime side; it tells each plugin that connects
// that the pods and containers of running are running.
func startRuntime(t *testing.T, dir string, running ...*api.Container) *runtimeSide {
	t.Helper()
	r, err := nri.New("test-runtime", "v1", func(ctx context.Context, cb nri.SyncCB) error {
		var pods []*api.PodSandbox
		for _, c := range running {
			name := strings.TrimPrefix(c.PodSandboxId, "sb-")
			pods = append(pods, &api.PodSandbox{Id: c.PodSandboxId, Name: name, Namespace: "ns", Uid: "uid-" + name})
		}
		_, err := cb(ctx, pods, running)
		return err
	}, func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil },
		nri.WithSocketPath(filepath.Join(dir, "nri.sock")), nri.WithPluginPath(filepath.Join(dir, "plugins")), nri.WithPluginConfigPath(filepath.Join(dir, "conf")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return &runtimeSide{Adaptation: r, t: t}
}

// create asks the plugins to adjust container main, with the environment
// env ("NAME=value"), of pod name in namespace ns.
func (r *runtimeSide) create(ctx context.Context, namespace, name, uid string, env ...string) (*api.ContainerAdjustment, error) {
	return r.createWith(ctx, namespace, name, uid, &api.Container{Env: env})
}

// createWith asks the plugins to adjust container main of pod name, as ctr
// describes it (its environment and device nodes, as the runtime built
// them); its ID is ctr-<name>.
func (r *runtimeSide) createWith(ctx context.Context, namespace, name, uid string, ctr *api.Container) (*api.ContainerAdjustment, error) {
	ctr.Id, ctr.PodSandboxId, ctr.Name = "ctr-"+name, "sb-"+name, "main"
	resp, err := r.CreateContainer(ctx, &api.CreateContainerRequest{
		Pod:       &api.PodSandbox{Id: "sb-" + name, Name: name, Namespace: namespace, Uid: uid},
		Container: ctr,
	})
	if err != nil {
		return nil, err
	}
	return resp.GetAdjust(), nil
}

// stop tells the plugins that pod name's container main stopped.
func (r *runtimeSide) stop(ctx context.Context, name string) {
	r.t.Helper()
	pod, ctr := existing(name)
	if _, err := r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr}); err != nil {
		r.t.Fatal(err)
	}
}

// remove tells the plugins that pod name's container main was removed.
func (r *runtimeSide) remove(ctx context.Context, name string) {
	r.t.Helper()
	pod, ctr := existing(name)
	if err := r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr}); err != nil {
		r.t.Fatal(err)
	}
}

// existing is pod name's sandbox and container main, as created.
func existing(name string) (*api.PodSandbox, *api.Container) {
	return &api.PodSandbox{Id: "sb-" + name, Name: name, Namespace: "ns"},
		&api.Container{Id: "ctr-" + name, PodSandboxId: "sb-" + name, Name: "main"}
}

// checkGetsGPU0 fails the test unless pod p0's container gets card GPU-0.
func (r *runtimeSide) checkGetsGPU0(tCtx ktesting.TContext, when string) {
	r.t.Helper()
	if adj, err := r.create(tCtx, "ns", "p0", "uid-p0"); err != nil || env(adj)["NVIDIA_VISIBLE_DEVICES"] != "GPU-0" {
		r.t.Errorf("%s: pod p0 got %v, %v; want card GPU-0", when, adj, err)
	}
}

func env(adj *api.ContainerAdjustment) map[string]string {
	m := map[string]string{}
	for _, kv := range adj.GetEnv() {
		m[kv.Key] = kv.Value
	}
	return m
}

// runPlugin serves the plugin on dir's socket until the test ends.
func runPlugin(tCtx ktesting.TContext, p *Plugin, dir string) {
	ctx, cancel := context.WithCancel(tCtx)
	done := make(chan struct{})
	go func() { p.Run(ctx, filepath.Join(dir, "nri.sock")); close(done) }()
	tCtx.Cleanup(func() { cancel(); <-done })
}

// waitReady waits until the plugin reports it can enforce.
func waitReady(tCtx ktesting.TContext, p *Plugin, want bool) {
	tCtx.Helper()
	if err := wait.PollUntilContextTimeout(tCtx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return (p.NotReady() == "") == want, nil
	}); err != nil {
		tCtx.Fatalf("the plugin's readiness never became %t (NotReady %q)", want, p.NotReady())
	}
}

// newPlugin is a plugin for node-1, which has testCards, with its shared
// regions in a directory of the test's.
func newPlugin(t *testing.T) *Plugin {
	cfg := enforce.DefaultConfig()
	cfg.Paths.HostCacheDir = t.TempDir()
	p := &Plugin{Node: "node-1", Enforce: cfg, PodWait: time.Second, Unrestricted: []string{"ns:exporter"}, RetryMax: 200 * time.Millisecond}
	p.Update(testCards())
	return p
}

// TestNRIAgainstRuntime drives the plugin through NRI's own runtime side
// over its unix socket, as containerd would.
func TestNRIAgainstRuntime(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)

	var pods []*v1.Pod
	for i := 0; i < 20; i++ {
		pods = append(pods, gpuPod(fmt.Sprint("p", i), i))
	}
	missing := gpuPod("unassigned", 0)
	delete(missing.Annotations, gpuinfo.AssignmentAnnotation)
	exporter := st.MakePod().Name("exporter").Namespace("ns").UID("uid-exporter").Node("node-1").Container("main").Obj()
	exporter.Spec.ServiceAccountName = "exporter"
	pods = append(pods, missing, exporter, st.MakePod().Name("plain").Namespace("ns").UID("uid-plain").Node("node-1").Container("main").Obj())
	plugin := newPlugin(t)
	plugin.SetPods(podMap(pods...))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)

	// Many containers created at once each get their own pod's cards.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			adj, err := runtime.create(tCtx, "ns", fmt.Sprint("p", i), fmt.Sprint("uid-p", i))
			if err != nil {
				errs <- err
				return
			}
			e := env(adj)
			if e["NVIDIA_VISIBLE_DEVICES"] != fmt.Sprint("GPU-", i) || e["CUDA_DEVICE_MEMORY_LIMIT_0"] != "4096m" || e["CUDA_DEVICE_SM_LIMIT_0"] != "25" {
				errs <- fmt.Errorf("pod p%d got %v", i, e)
			}
			if cdi := adj.GetCDIDevices(); len(cdi) != 1 || cdi[0].GetName() != fmt.Sprint("nvidia.com/gpu=", i) {
				errs <- fmt.Errorf("pod p%d got CDI devices %v, want its card's", i, cdi)
			}
			if len(adj.GetMounts()) != 3 {
				errs <- fmt.Errorf("pod p%d got %d mounts, want 3", i, len(adj.GetMounts()))
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	if adj, err := runtime.create(tCtx, "ns", "plain", "uid-plain"); err != nil || env(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" || len(adj.GetMounts()) != 0 {
		t.Errorf("a container without GPUs was not hidden from the cards: %v, %v", adj, err)
	}
	if adj, err := runtime.create(tCtx, "ns", "exporter", "uid-exporter"); err != nil || len(adj.GetEnv()) != 0 {
		t.Errorf("a container of an unrestricted service account was adjusted: %v, %v", adj, err)
	}
	// The same namespace is not enough: plain runs as another account, and
	// an exporter's name under another UID is not the exporter.
	if adj, err := runtime.create(tCtx, "ns", "exporter", "uid-impostor"); err != nil || env(adj)["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Errorf("a sandbox under another UID was left unrestricted: %v, %v", adj, err)
	}
	if _, err := runtime.create(tCtx, "ns", "unassigned", "uid-unassigned"); err == nil || !strings.Contains(err.Error(), "has no tessera.io/gpu-assignment") {
		t.Errorf("a GPU container without an assignment was allowed: %v", err)
	}
	if _, err := runtime.create(tCtx, "ns", "p1", "uid-someone-else"); err == nil || !strings.Contains(err.Error(), "refusing to give GPUs") {
		t.Errorf("a sandbox with another UID got the pod's GPUs: %v", err)
	}
}

// TestNRIAnswersWithinTheRuntimeTimeout: a container whose pod the agent
// never sees is refused before NRI's request timeout (2 s by default)
// expires, even with a longer PodWait, so the runtime keeps the plugin
// instead of dropping it and creating containers unadjusted.
func TestNRIAnswersWithinTheRuntimeTimeout(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	plugin.PodWait = 10 * time.Second
	plugin.SetPods(podMap(gpuPod("p0", 0)))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)

	start := time.Now()
	_, err := runtime.create(tCtx, "ns", "ghost", "uid-ghost")
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "no pod bound to node node-1 found in the API within") {
		t.Errorf("a container of an unknown pod: %v, want the plugin's refusal", err)
	}
	if took >= nri.DefaultPluginRequestTimeout {
		t.Errorf("the answer took %v, not inside NRI's request timeout %v", took, nri.DefaultPluginRequestTimeout)
	}
	if plugin.NotReady() != "" {
		t.Errorf("the runtime dropped the plugin: %s", plugin.NotReady())
	}
	runtime.checkGetsGPU0(tCtx, "after the refusal")
}

// TestNRIFailsClosedWhileStarting: registered before its pod cache syncs,
// the plugin refuses containers (kubelet retries them) rather than letting
// the runtime create them without enforcement, and says it is not ready.
func TestNRIFailsClosedWhileStarting(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)
	plugin := newPlugin(t)
	runPlugin(tCtx, plugin, dir)
	if err := wait.PollUntilContextTimeout(tCtx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return plugin.NotReady() == reasonNoPodCache, nil
	}); err != nil {
		t.Fatalf("NotReady = %q, want %q", plugin.NotReady(), reasonNoPodCache)
	}
	if _, err := runtime.create(tCtx, "ns", "p0", "uid-p0"); err == nil || !strings.Contains(err.Error(), "the node agent is starting") {
		t.Errorf("a container created before the pod cache synced: %v, want a refusal", err)
	}
	plugin.SetPods(podMap(gpuPod("p0", 0)))
	waitReady(tCtx, plugin, true)
	runtime.checkGetsGPU0(tCtx, "after the sync")
}

// TestNRIReconnects: when the runtime goes away (a containerd restart) the
// plugin says so, and connects again when the runtime is back.
func TestNRIReconnects(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	first := startRuntime(t, dir)
	plugin := newPlugin(t)
	plugin.SetPods(podMap(gpuPod("p0", 0)))
	// The plugin's connections, to break them as a runtime that exits does.
	var mu sync.Mutex
	var conns []net.Conn
	plugin.dial = func(socket string) (net.Conn, error) {
		c, err := net.Dial("unix", socket)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	changes := plugin.Changes()
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)
	<-changes // connecting signalled it: drained, so that only the loss can signal now

	first.Stop()
	mu.Lock()
	for _, c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
	waitReady(tCtx, plugin, false)
	if got := plugin.NotReady(); !strings.HasPrefix(got, reasonNotConnected+" since ") {
		t.Errorf("NotReady = %q, want it to say since when the plugin is not connected", got)
	}
	select {
	case <-changes:
	default:
		t.Error("no change was signalled")
	}

	second := startRuntime(t, dir)
	t.Cleanup(second.Stop)
	waitReady(tCtx, plugin, true)
	second.checkGetsGPU0(tCtx, "after reconnecting")
}

// TestNRITaskPriority: containers sharing a card get HAMi-core's task
// priority from their pod's priority (high from the agent's threshold), or
// from the pod's annotation; whole cards get none; an invalid annotation
// stops the container with the reason; and the agent's value replaces the
// container's own once the runtime applies the adjustment (NRI's own spec
// generator, as containerd applies it).
func TestNRITaskPriority(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	runtime := startRuntime(t, dir)
	t.Cleanup(runtime.Stop)
	withPriority := func(p *v1.Pod, priority int32, annotation string) *v1.Pod {
		p.Spec.Priority = &priority
		if annotation != "" {
			p.Annotations[gpuinfo.TaskPriorityAnnotation] = annotation
		}
		return p
	}
	whole := gpuPod("whole", 1)
	whole.Annotations[gpuinfo.AssignmentAnnotation] = `{"version":1,"containers":{"main":[{"index":1,"uuid":"GPU-1","memoryMiB":81920,"cores":100}]}}`
	whole.Spec.Containers[0].Resources.Limits = v1.ResourceList{"tessera.io/gpu": resource.MustParse("1")}
	plugin := newPlugin(t)
	plugin.SetPods(podMap(
		withPriority(gpuPod("critical", 0), enforce.DefaultHighTaskPriority, ""),
		withPriority(gpuPod("batch", 0), enforce.DefaultHighTaskPriority-1, ""),
		withPriority(gpuPod("yielding", 0), enforce.DefaultHighTaskPriority, "low"),
		withPriority(gpuPod("promoted", 0), 0, "high"),
		withPriority(gpuPod("typo", 0), 0, "hgih"),
		withPriority(whole, enforce.DefaultHighTaskPriority, "high"),
	))
	runPlugin(tCtx, plugin, dir)
	waitReady(tCtx, plugin, true)

	for _, tc := range []struct {
		pod     string
		userEnv []string
		want    []string // CUDA_TASK_PRIORITY in the container's final environment
	}{
		{pod: "critical", want: []string{"0"}},
		{pod: "batch", want: []string{"1"}},
		{pod: "batch", userEnv: []string{"CUDA_TASK_PRIORITY=0"}, want: []string{"1"}},
		{pod: "yielding", want: []string{"1"}},
		{pod: "promoted", want: []string{"0"}},
		{pod: "whole", userEnv: []string{"CUDA_TASK_PRIORITY=0"}, want: []string{"0"}}, // left as the user set it: no interception
		{pod: "whole", want: nil},
	} {
		adj, err := runtime.create(tCtx, "ns", tc.pod, "uid-"+tc.pod, tc.userEnv...)
		if err != nil {
			t.Errorf("pod %s: %v", tc.pod, err)
			continue
		}
		if diff := cmp.Diff(tc.want, taskPriorities(t, tc.userEnv, adj)); diff != "" {
			t.Errorf("pod %s with environment %v: CUDA_TASK_PRIORITY (-want,+got):\n%s", tc.pod, tc.userEnv, diff)
		}
	}
	// The image and the pod spec both set it: the runtime would keep the
	// spec's copy over the agent's, so the container is refused.
	if _, err := runtime.create(tCtx, "ns", "batch", "uid-batch", "CUDA_TASK_PRIORITY=1", "CUDA_TASK_PRIORITY=0"); err == nil || !strings.Contains(err.Error(), "sets CUDA_TASK_PRIORITY 2 times") {
		t.Errorf("a container setting CUDA_TASK_PRIORITY twice: %v, want a refusal", err)
	}
	if _, err := runtime.create(tCtx, "ns", "typo", "uid-typo"); err == nil || !strings.Contains(err.Error(), `annotation tessera.io/gpu-task-priority: must be "high" or "low", got "hgih"`) {
		t.Errorf("a container whose pod has an invalid task priority: %v, want a refusal naming the annotation", err)
	}
}

// taskPriorities applies adj to a container spec whose process environment
// is env, with NRI's spec generator, and returns every CUDA_TASK_PRIORITY
// value in the result.
func taskPriorities(t *testing.T, env []string, adj *api.ContainerAdjustment) []string {
	t.Helper()
	spec, err := rgen.New("linux")
	if err != nil {
		t.Fatal(err)
	}
	spec.Config.Process.Env = env
	if err := nrigen.SpecGenerator(&spec).Adjust(adj); err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, kv := range spec.Config.Process.Env {
		if v, ok := strings.CutPrefix(kv, "CUDA_TASK_PRIORITY="); ok {
			values = append(values, v)
		}
	}
	return values
}
