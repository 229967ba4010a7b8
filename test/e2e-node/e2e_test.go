//go:build e2enode

package e2enode

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// container is one container of a test pod: its name, whether it is an
// init container (sidecar when restartAlways) and its GPU limits.
type container struct {
	name          string
	init, sidecar bool
	limits        map[string]int64
}

// podSpec is a pod for the binpack profile, kept to node by its hostname,
// with the containers given (one, "main", without GPUs, by default) and
// priority class.
func podSpec(ns, name string, class string, containers ...container) *v1.Pod {
	if len(containers) == 0 {
		containers = []container{{name: "main"}}
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{
			SchedulerName: "tessera-binpack", PriorityClassName: class,
			NodeSelector: map[string]string{v1.LabelHostname: node},
		},
	}
	for _, c := range containers {
		spec := v1.Container{Name: c.name, Image: image, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
		for r, q := range c.limits {
			spec.Resources.Limits[v1.ResourceName(r)] = *resource.NewQuantity(q, resource.DecimalSI)
		}
		switch {
		case c.sidecar:
			always := v1.ContainerRestartPolicyAlways
			spec.RestartPolicy = &always
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, spec)
		case c.init:
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, spec)
		default:
			pod.Spec.Containers = append(pod.Spec.Containers, spec)
		}
	}
	return pod
}

// testNamespace creates a namespace for the test, removed when it ends.
func testNamespace(tCtx ktesting.TContext) string {
	// Labelled as an operator would, so that its pods may take
	// tessera-critical (the admission policy tessera-high-priority).
	ns, err := suite.cp.Client.CoreV1().Namespaces().Create(tCtx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "e2e-", Labels: map[string]string{manifests.HighPriorityLabel: manifests.HighPriorityAllowed},
	}}, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	tCtx.Cleanup(func() {
		// No kubelet confirms deletions and no namespace controller empties
		// the namespace: the pods go at once, freeing their cards.
		ctx := context.Background()
		zero := int64(0)
		_ = suite.cp.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = suite.cp.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// schedule creates the pods and waits until the scheduler has bound every
// one (to some node); it returns them as bound, by name.
func schedule(tCtx ktesting.TContext, pods ...*v1.Pod) map[string]*v1.Pod {
	tCtx.Helper()
	for _, p := range pods {
		if _, err := suite.cp.Client.CoreV1().Pods(p.Namespace).Create(tCtx, p, metav1.CreateOptions{}); err != nil {
			tCtx.Fatal(err)
		}
	}
	bound := map[string]*v1.Pod{}
	err := wait.PollUntilContextTimeout(tCtx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, p := range pods {
			got, err := suite.cp.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil || got.Spec.NodeName == "" {
				return false, nil
			}
			bound[p.Name] = got
		}
		return true, nil
	})
	if err != nil {
		tCtx.Fatalf("pods not bound: %v", err)
	}
	return bound
}

// cards is a container's assignment as the scheduler wrote it.
func cardsOf(tCtx ktesting.TContext, pod *v1.Pod, container string) []gpuinfo.CardAssignment {
	tCtx.Helper()
	a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		tCtx.Fatalf("pod %s: %v", pod.Name, err)
	}
	return a.Containers[container]
}

// runSandbox runs pod's sandbox (under uid, the pod's own when empty) and
// removes it when the test ends.
func runSandbox(tCtx ktesting.TContext, pod *v1.Pod, uid types.UID) *sandbox {
	tCtx.Helper()
	if uid == "" {
		uid = pod.UID
	}
	sb, err := suite.runtime.runSandbox(tCtx, pod, string(uid))
	if err != nil {
		tCtx.Fatalf("sandbox of pod %s: %v", pod.Name, err)
	}
	tCtx.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = suite.runtime.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.id})
		_, _ = suite.runtime.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.id})
	})
	return sb
}

// startContainer creates and starts the pod's container in the sandbox, as
// kubelet does, with the spec's environment; it fails the test if either
// fails.
func startContainer(tCtx ktesting.TContext, sb *sandbox, pod *v1.Pod, name string) *running {
	tCtx.Helper()
	id, err := createAsKubelet(tCtx, sb, pod, name)
	if err != nil {
		tCtx.Fatalf("creating container %s of pod %s: %v", name, pod.Name, err)
	}
	r, err := suite.runtime.start(tCtx, id)
	if err != nil {
		tCtx.Fatalf("starting container %s of pod %s: %v", name, pod.Name, err)
	}
	return r
}

// createAsKubelet creates the container, retrying for a while, as kubelet
// does, when the agent answers that it has not seen the pod bound to the
// node yet (its watch may lag the binding by a moment under load).
func createAsKubelet(ctx context.Context, sb *sandbox, pod *v1.Pod, name string, cdiDevices ...string) (string, error) {
	return createAsKubeletWith(ctx, sb, pod, name, extra{cdiDevices: cdiDevices})
}

// createAsKubeletWith is createAsKubelet with extra CDI devices and
// annotations.
func createAsKubeletWith(ctx context.Context, sb *sandbox, pod *v1.Pod, name string, x extra) (string, error) {
	var id string
	var err error
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		id, err = suite.runtime.createContainer(ctx, sb, pod, name, x)
		return err == nil || !strings.Contains(err.Error(), "kubelet will retry"), nil
	})
	return id, err
}

// wantShared is what a container holding shared cards must run with, from
// docs/node-agent.md, given its assignment, its shared region's file name
// and its task priority.
func wantShared(cards []gpuinfo.CardAssignment, region, taskPriority string) map[string]string {
	uuids := make([]string, len(cards))
	want := map[string]string{
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/" + region,
		"CUDA_TASK_PRIORITY":              taskPriority,
	}
	for i, c := range cards {
		uuids[i] = c.UUID
		want["CUDA_DEVICE_MEMORY_LIMIT_"+strconv.Itoa(i)] = strconv.FormatInt(c.MemoryMiB, 10) + "m"
		want["CUDA_DEVICE_SM_LIMIT_"+strconv.Itoa(i)] = strconv.FormatInt(c.Cores, 10)
		if c.Cores < gpuinfo.FullCores {
			want["GPU_CORE_UTILIZATION_POLICY"] = "force"
		}
	}
	want["NVIDIA_VISIBLE_DEVICES"] = strings.Join(uuids, ",")
	return want
}

// checkEnv compares the given variables of the process's environment.
func checkEnv(t testing.TB, what string, r *running, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for k := range want {
		if v, ok := r.environ[k]; ok {
			got[k] = v
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: environment (-want,+got):\n%s", what, diff)
	}
}

// checkDevices compares the /dev/nvidia* nodes the process sees with the
// assigned cards' (the CDI spec maps card i to /dev/nvidia<i>, and adds
// /dev/nvidiactl).
func checkDevices(t testing.TB, what string, r *running, cards []gpuinfo.CardAssignment) {
	t.Helper()
	var want []string
	for _, c := range cards {
		want = append(want, fmt.Sprintf("nvidia%d", c.Index))
	}
	if len(want) > 0 {
		want = append(want, "nvidiactl")
	}
	if diff := cmp.Diff(want, r.devices()); diff != "" {
		t.Errorf("%s: GPU device nodes (-want,+got):\n%s", what, diff)
	}
}

// region is the shared-region file the agent gives a container it creates.
func (r *running) region() string { return r.id + ".cache" }

// checkInterception checks the library's mounts: present and as documented
// when region names the container's shared region, absent when it is "".
// Of the cache directory the container sees its own region and nothing
// else: no neighbour's limits, usage or process IDs.
func checkInterception(t testing.TB, what string, r *running, region string) {
	t.Helper()
	want := region != ""
	mounts := r.mounts()
	documented := map[string]struct {
		source   string
		readOnly bool
	}{
		"/usr/local/vgpu/libvgpu.so": {filepath.Join(vgpuDir(), "libvgpu.so"), true},
		"/etc/ld.so.preload":         {filepath.Join(vgpuDir(), "ld.so.preload"), true},
	}
	if want {
		documented["/usr/local/vgpu/cache/"+region] = struct {
			source   string
			readOnly bool
		}{filepath.Join(vgpuDir(), "cache", region), false}
	}
	for dst, d := range documented {
		m, ok := mounts[dst]
		switch {
		case !want && ok:
			t.Errorf("%s: has the interception mount %s", what, dst)
		case want && !ok:
			t.Errorf("%s: lacks the interception mount %s", what, dst)
		case want && (m.Source != d.source || hasOption(m.Options, "ro") != d.readOnly):
			t.Errorf("%s: mount %s is %s %v, want %s read-only=%t", what, dst, m.Source, m.Options, d.source, d.readOnly)
		}
	}
	for dst := range mounts {
		if strings.HasPrefix(dst, "/usr/local/vgpu/cache") && documented[dst].source == "" {
			t.Errorf("%s: mounts %s, besides its own region", what, dst)
		}
	}
	// What the container's processes see of the cache directory.
	var seen []string
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/usr/local/vgpu/cache", r.pid))
	for _, e := range entries {
		seen = append(seen, e.Name())
	}
	switch {
	case want && (len(seen) != 1 || seen[0] != region):
		t.Errorf("%s: sees %v in /usr/local/vgpu/cache (%v), want only its own region %s", what, seen, err, region)
	case !want && len(seen) > 0:
		t.Errorf("%s: sees shared regions %v", what, seen)
	}
	// What the dynamic loader of every process in the container reads.
	preload, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/ld.so.preload", r.pid))
	switch {
	case want && string(preload) != "/usr/local/vgpu/libvgpu.so\n":
		t.Errorf("%s: /etc/ld.so.preload holds %q (%v), want the library's path", what, preload, err)
	case !want && err == nil:
		t.Errorf("%s: has an /etc/ld.so.preload: %q", what, preload)
	}
}

func hasOption(options []string, o string) bool {
	for _, x := range options {
		if x == o {
			return true
		}
	}
	return false
}

// TestSharedCards: two pods sharing one card — a critical one and a batch
// one — each run with exactly their card, HAMi-core's limits, their task
// priority and the library mounted, whatever the image and the pod spec set.
func TestSharedCards(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	share := map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 30}
	critical := podSpec(ns, "critical", "tessera-critical", container{name: "main", limits: share})
	batch := podSpec(ns, "batch", "tessera-batch", container{name: "main", limits: share})
	// The image sets CUDA_TASK_PRIORITY=0 and a memory limit of its own; the
	// spec asks for all the card's compute.
	batch.Spec.Containers[0].Env = []v1.EnvVar{{Name: "CUDA_DEVICE_SM_LIMIT_0", Value: "100"}}
	pods := schedule(tCtx, critical, batch)
	for name, priority := range map[string]string{"critical": "0", "batch": "1"} {
		pod := pods[name]
		cards := cardsOf(tCtx, pod, "main")
		r := startContainer(tCtx, runSandbox(tCtx, pod, ""), pod, "main")
		what := "pod " + name
		checkEnv(t, what, r, wantShared(cards, r.region(), priority))
		checkDevices(t, what, r, cards)
		checkInterception(t, what, r, r.region())
	}
	// The agent's probes answer anyone: it is alive and ready (connected to
	// containerd's NRI, its pods synced, its cards published).
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := agentGet(tCtx, path, ""); code != http.StatusOK {
			t.Errorf("GET %s on the agent: %d %s, want 200", path, code, body)
		}
	}
	// The agent's endpoint reports each container's assignment.
	raw := scrapeAgent(tCtx)
	for _, name := range []string{"critical", "batch"} {
		card := cardsOf(tCtx, pods[name], "main")[0]
		want := fmt.Sprintf(`tessera_agent_container_memory_assigned_mib{card="%d",container="main",namespace="%s",node="%s",pod="%s"} %d`, card.Index, ns, node, name, card.MemoryMiB)
		if !strings.Contains(raw, want) {
			t.Errorf("the agent's metrics lack %s", want)
		}
	}
}

// scrapeAgent reads the agent's metrics as Prometheus does: over HTTPS, with
// a token of the shipped tessera-metrics-reader ServiceAccount, which the
// agent reviews with the API server under its own identity.
func scrapeAgent(tCtx ktesting.TContext) string {
	tCtx.Helper()
	token, err := suite.cp.Client.CoreV1().ServiceAccounts(manifests.Namespace).CreateToken(tCtx, "tessera-metrics-reader",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatalf("a token of the metrics reader: %v", err)
	}
	code, raw := agentGet(tCtx, "/metrics", token.Status.Token)
	if code != http.StatusOK {
		tCtx.Fatalf("the agent's metrics port answered %d: %s", code, raw)
	}
	return raw
}

// agentGet GETs path on the agent's HTTPS port, with token when not empty,
// and returns the status code and body.
func agentGet(tCtx ktesting.TContext, path, token string) (int, string) {
	tCtx.Helper()
	req, err := http.NewRequestWithContext(tCtx, http.MethodGet, "https://"+agentMetricsAddress+path, nil)
	if err != nil {
		tCtx.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The agent's certificate is self-signed, as Prometheus's ServiceMonitor
	// accepts it (insecureSkipVerify).
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the agent's self-signed certificate
	resp, err := client.Do(req)
	if err != nil {
		tCtx.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tCtx.Fatal(err)
	}
	return resp.StatusCode, string(raw)
}

// TestWholeCards: a container holding whole cards sees exactly them, with no
// interception: no library, no limits written by the agent.
func TestWholeCards(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := schedule(tCtx, podSpec(ns, "trainer", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu": 2}}))["trainer"]
	cards := cardsOf(tCtx, pod, "main")
	r := startContainer(tCtx, runSandbox(tCtx, pod, ""), pod, "main")
	checkEnv(t, "whole cards", r, map[string]string{"NVIDIA_VISIBLE_DEVICES": cards[0].UUID + "," + cards[1].UUID, "CUDA_DEVICE_MEMORY_LIMIT_0": "1000000m"})
	checkDevices(t, "whole cards", r, cards)
	checkInterception(t, "whole cards", r, "")
}

// TestInitContainerAndSidecar: a regular init container gets its own entry
// of the assignment, a sidecar without GPUs sees no card (whatever its image
// says), and the app container gets its entry (docs/contract.md).
func TestInitContainerAndSidecar(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := schedule(tCtx, podSpec(ns, "server", "",
		container{name: "prepare", init: true, limits: map[string]int64{"tessera.io/gpu-memory": 4096}},
		container{name: "log-shipper", sidecar: true},
		container{name: "serve", limits: map[string]int64{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 50}},
	))["server"]
	sb := runSandbox(tCtx, pod, "")
	for _, name := range []string{"prepare", "serve"} {
		cards := cardsOf(tCtx, pod, name)
		r := startContainer(tCtx, sb, pod, name)
		checkEnv(t, name, r, wantShared(cards, r.region(), "1"))
		checkDevices(t, name, r, cards)
		checkInterception(t, name, r, r.region())
	}
	checkNoGPU(t, "sidecar", startContainer(tCtx, sb, pod, "log-shipper"))
}

// checkNoGPU checks a container the agent hid every card from.
func checkNoGPU(t testing.TB, what string, r *running) {
	t.Helper()
	checkEnv(t, what, r, map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"})
	checkDevices(t, what, r, nil)
	checkInterception(t, what, r, "")
}

// TestPodWithoutGPUsSeesNone: a pod that asks for no GPU, from an image
// that sets NVIDIA_VISIBLE_DEVICES=all, sees no card.
func TestPodWithoutGPUsSeesNone(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	pod := schedule(tCtx, podSpec(ns, "web", ""))["web"]
	checkNoGPU(t, "pod without GPUs", startContainer(tCtx, runSandbox(tCtx, pod, ""), pod, "main"))
}

// TestRefusals: the runtime creates no container, and reports the agent's
// reason, for a pod bound to another node, a sandbox under another UID, a
// pod not bound at all, a pod whose annotation became invalid after
// binding, and a pod whose spec sets a limit variable its image sets too.
func TestRefusals(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	share := map[string]int64{"tessera.io/gpu-memory": 4096}
	elsewhere := podSpec(ns, "elsewhere", "", container{name: "main", limits: share})
	elsewhere.Spec.NodeSelector[v1.LabelHostname] = otherNode
	retagged := podSpec(ns, "retagged", "", container{name: "main", limits: share})
	// The image sets this variable too: containerd would keep this copy
	// over the agent's.
	escaping := podSpec(ns, "escaping", "", container{name: "main", limits: share})
	escaping.Spec.Containers[0].Env = []v1.EnvVar{{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "81920m"}}
	pods := schedule(tCtx, elsewhere, retagged, escaping, podSpec(ns, "impostor", "", container{name: "main", limits: share}))
	pending := podSpec(ns, "pending", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 200000}})
	created, err := suite.cp.Client.CoreV1().Pods(ns).Create(tCtx, pending, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods["pending"] = created
	patch := []byte(`{"metadata":{"annotations":{"` + gpuinfo.TaskPriorityAnnotation + `":"urgent"}}}`)
	if pods["retagged"], err = suite.cp.Client.CoreV1().Pods(ns).Patch(tCtx, "retagged", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pod  string
		uid  types.UID
		want string
	}{
		{pod: "elsewhere", want: "no pod bound to node " + node + " found in the API"},
		{pod: "impostor", uid: "0badc0de-0000-0000-0000-000000000000", want: "refusing to give GPUs to another pod's container"},
		{pod: "pending", want: "no pod bound to node " + node + " found in the API"},
		{pod: "escaping", want: "sets CUDA_DEVICE_MEMORY_LIMIT_0 2 times (its image and its pod spec)"},
		{pod: "retagged", want: `annotation tessera.io/gpu-task-priority: must be "high" or "low", got "urgent"`},
	} {
		pod := pods[tc.pod]
		sb := runSandbox(tCtx, pod, tc.uid)
		_, err := suite.runtime.createContainer(tCtx, sb, pod, "main", extra{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pod %s: CreateContainer returned %v; want the agent's refusal %q", tc.pod, err, tc.want)
		}
	}
	// The refusal is also on the pod, for its owner to see.
	waitEvent(tCtx, pods["escaping"], "GPUContainerRefused", "sets CUDA_DEVICE_MEMORY_LIMIT_0 2 times")
}

// TestConcurrentContainers: twenty containers created at once each run with
// their own pod's card and limits.
func TestConcurrentContainers(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	var specs []*v1.Pod
	for i := 0; i < 20; i++ {
		specs = append(specs, podSpec(ns, fmt.Sprint("replica-", i), "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": int64(2048 + 512*i)}}))
	}
	pods := schedule(tCtx, specs...)
	sandboxes := map[string]*sandbox{}
	for name, pod := range pods {
		sandboxes[name] = runSandbox(tCtx, pod, "")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	started := map[string]*running{}
	errs := make(chan error, len(pods))
	for name, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := createAsKubelet(tCtx, sandboxes[name], pod, "main")
			if err != nil {
				errs <- fmt.Errorf("pod %s: %w", name, err)
				return
			}
			r, err := suite.runtime.start(tCtx, id)
			if err != nil {
				errs <- fmt.Errorf("pod %s: %w", name, err)
				return
			}
			mu.Lock()
			started[name] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for name, r := range started {
		cards := cardsOf(tCtx, pods[name], "main")
		checkEnv(t, "pod "+name, r, wantShared(cards, r.region(), "1"))
		checkDevices(t, "pod "+name, r, cards)
	}
}

// TestAgentDown: with the agent stopped (a rollout, a crash), containerd
// creates containers without it — NRI has no notion of a required plugin —
// so a GPU container starts unadjusted: its image's NVIDIA_VISIBLE_DEVICES=all
// is in its environment, but no card is handed over (no CDI device, no
// device node) and no library is mounted. On a GPU node, what keeps such a
// container from every card is the container toolkit refusing that variable
// from unprivileged containers (docs/install.md). When the agent is back it
// finds that container among those the runtime lists, stops it (it could
// see every card where the toolkit honours the variable) and says so on
// the pod; containers created since get their cards.
func TestAgentDown(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	share := map[string]int64{"tessera.io/gpu-memory": 4096, "tessera.io/gpu-cores": 20}
	pod := schedule(tCtx, podSpec(ns, "restarting", "",
		container{name: "first", limits: share}, container{name: "second", limits: share}))["restarting"]
	sb := runSandbox(tCtx, pod, "")

	suite.agent.stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if a, err := startAgent(context.Background()); err == nil {
				suite.agent = a
			}
		}
	})
	id, err := suite.runtime.createContainer(tCtx, sb, pod, "first", extra{})
	if err != nil {
		t.Fatalf("with the agent down, CreateContainer failed: %v", err)
	}
	escaped, err := suite.runtime.start(tCtx, id)
	if err != nil {
		t.Fatalf("starting the container created while the agent was down: %v", err)
	}
	t.Logf("with the agent down, the runtime started the container with NVIDIA_VISIBLE_DEVICES=%q from its image", escaped.environ["NVIDIA_VISIBLE_DEVICES"])
	checkDevices(t, "created while the agent was down", escaped, nil)
	checkInterception(t, "created while the agent was down", escaped, "")
	if _, ok := escaped.environ["CUDA_DEVICE_SM_LIMIT_0"]; ok {
		t.Fatal("created while the agent was down, yet it has limits: the test cannot tell the agent was down")
	}

	if suite.agent, err = startAgent(tCtx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// The agent stops it: its process goes, the runtime sees it exit.
	if err := wait.PollUntilContextTimeout(tCtx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		status, err := suite.runtime.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		return err == nil && status.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED, nil
	}); err != nil {
		t.Errorf("the container created while the agent was down still runs: %v", err)
	}
	waitEvent(tCtx, pod, "GPUContainerUnenforced", "the agent stopped it")

	cards := cardsOf(tCtx, pod, "second")
	r := startContainer(tCtx, sb, pod, "second")
	checkEnv(t, "created after the agent came back", r, wantShared(cards, r.region(), "1"))
	checkDevices(t, "created after the agent came back", r, cards)
	checkInterception(t, "created after the agent came back", r, r.region())
}

// waitEvent waits for an Event of reason on pod whose note contains text.
func waitEvent(tCtx ktesting.TContext, pod *v1.Pod, reason, text string) {
	tCtx.Helper()
	var notes []string
	err := wait.PollUntilContextTimeout(tCtx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := suite.cp.Client.EventsV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		notes = notes[:0]
		for _, e := range events.Items {
			if e.Regarding.UID == pod.UID && e.Reason == reason {
				notes = append(notes, e.Note)
				if strings.Contains(e.Note, text) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		tCtx.Errorf("no %s Event on pod %s saying %q (its %s Events: %q)", reason, pod.Name, text, reason, notes)
	}
}
