package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/fleet"
	"github.com/tessera-gpu/tessera/internal/version"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/serving"
	"github.com/tessera-gpu/tessera/pkg/apis/reservation/v1alpha1"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// env is the cluster every test reads: one control plane per test binary.
var env struct {
	cp         *cluster.ControlPlane
	kubeconfig string
}

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := runMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "setting up the cluster:", err)
		code = 1
	}
	os.Exit(code)
}

// runMain starts a control plane with simulated GPU nodes and Tessera's
// scheduler, places the test pods, and runs the tests.
func runMain(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "kubectl-tessera-test")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	if err := cluster.LogToFile(filepath.Join(dir, "test.log")); err != nil {
		return 1, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := cluster.Start(func(string, ...any) {})
	if err != nil {
		return 1, err
	}
	defer cp.Stop()
	env.cp, env.kubeconfig = cp, filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(env.kubeconfig); err != nil {
		return 1, err
	}
	if err := addNodes(ctx, cp); err != nil {
		return 1, err
	}
	schedulerKubeconfig, schedulerConfig := filepath.Join(dir, "scheduler-kubeconfig"), filepath.Join(dir, "scheduler-config.yaml")
	if err := cp.WriteSchedulerKubeconfig(schedulerKubeconfig); err != nil {
		return 1, err
	}
	if err := cluster.WriteSchedulerConfig(cp.SchedulerConfig, schedulerKubeconfig, schedulerConfig); err != nil {
		return 1, err
	}
	sched, err := cluster.StartScheduler(ctx, schedulerConfig)
	if err != nil {
		return 1, err
	}
	defer sched.Stop()
	if err := placePods(ctx, cp); err != nil {
		return 1, err
	}
	if err := addTopUsers(ctx, cp); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// addNodes creates the GPU nodes: two A100s, two T4s, an A100 in MIG mode
// with three slices, an L4 node whose agent says it cannot enforce
// assignments, and a node whose inventory is invalid.
func addNodes(ctx context.Context, cp *cluster.ControlPlane) error {
	for _, n := range []struct {
		name  string
		spec  cluster.CardSpec
		cards int
	}{{"a100-node", cluster.A100, 2}, {"t4-node", cluster.T4, 2}, {"mig-node", "A100-40GB:mig=3g.20gb+2g.10gb+1g.5gb", 1}, {"l4-node", cluster.L4, 1}} {
		if _, err := cp.AddSimulatedNode(ctx, n.name, n.spec, n.cards, nil); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"NRI plugin not connected"}}}`, gpuinfo.AgentNotReadyAnnotation)
	if _, err := cp.Client.CoordinationV1().Leases(fleet.AgentNamespace).Patch(ctx, gpuinfo.AgentLeasePrefix+"l4-node",
		types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("marking l4-node's agent not ready: %w", err)
	}
	if _, err := cluster.CreateNode(ctx, cp.Client, "bad-node", nil); err != nil {
		return err
	}
	return cp.PublishInventory(ctx, "bad-node", `{"version":1,"cards":[{"index":0,"uuid":"","model":"X","memoryMiB":1024,"cores":100}]}`)
}

// testPod is a pod for the tessera-binpack profile; each container has the
// given GPU limits.
func testPod(ns, name string, annotations map[string]string, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       v1.PodSpec{SchedulerName: "tessera-binpack", Containers: containers},
	}
}

// gpuContainer is a container with the given limits, resource name (without
// the tessera.io/ prefix) to value.
func gpuContainer(name string, limits map[string]int64) v1.Container {
	c := v1.Container{Name: name, Image: "example.com/app:1", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
	for k, v := range limits {
		c.Resources.Limits[v1.ResourceName(gpuinfo.Domain+"/"+k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return c
}

// placePods creates the test pods one by one, each waiting to be bound (or
// marked unschedulable) before the next, so the cards they get do not
// depend on timing.
func placePods(ctx context.Context, cp *cluster.ControlPlane) error {
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	a100 := map[string]string{gpuinfo.ModelAnnotation: "A100"}
	video := testPod("team-b", "video", map[string]string{gpuinfo.ModelAnnotation: "T4"},
		gpuContainer("main", map[string]int64{"gpu-memory": 8192, "gpu-cores": 50}),
		gpuContainer("encoder", map[string]int64{"gpu-memory": 4096, "gpu-cores": 20}))
	video.Spec.InitContainers = []v1.Container{gpuContainer("warmup", map[string]int64{"gpu-memory-percent": 25, "gpu-cores": 10})}
	bound := []*v1.Pod{
		testPod("default", "train", a100, gpuContainer("main", map[string]int64{"gpu": 1})),
		testPod("default", "infer-0", a100, gpuContainer("main", map[string]int64{"gpu-memory": 20480, "gpu-cores": 30})),
		testPod("default", "infer-1", a100, gpuContainer("main", map[string]int64{"gpu-memory": 20480, "gpu-cores": 30})),
		video,
		testPod("default", "notebook", map[string]string{gpuinfo.IsolationAnnotation: gpuinfo.IsolationMIGShared},
			gpuContainer("main", map[string]int64{"gpu-memory": 2000})),
	}
	elsewhere := testPod("default", "no-such-node", nil, gpuContainer("main", map[string]int64{"gpu-memory": 1024}))
	elsewhere.Spec.NodeSelector = map[string]string{"example.com/pool": "none"}
	pending := []*v1.Pod{
		elsewhere,
		testPod("default", "too-big", nil, gpuContainer("main", map[string]int64{"gpu-memory": 163840})),
		testPod("default", "wrong-model", map[string]string{gpuinfo.ModelAnnotation: "B200"}, gpuContainer("main", map[string]int64{"gpu-memory": 1024})),
	}
	for _, p := range append(bound, pending...) {
		if _, err := cp.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cp.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return got.Spec.NodeName != "" || scheduledMessage(got) != "", nil
		})
		if err != nil {
			return fmt.Errorf("waiting for pod %s/%s to be scheduled or refused: %w", p.Namespace, p.Name, err)
		}
	}
	web := testPod("default", "web", nil, v1.Container{Name: "nginx", Image: "nginx"})
	_, err := cp.Client.CoreV1().Pods("default").Create(ctx, web, metav1.CreateOptions{})
	return err
}

// The users top runs as: both may list pods everywhere; only topUser is
// bound to the shipped Role tessera-top.
const (
	topUser    = "gpu-operator"
	viewerUser = "gpu-viewer"
)

// addTopUsers grants topUser and viewerUser their rights; the control plane
// has the shipped tessera-metrics-reader ServiceAccount and the Role
// tessera-top installed.
func addTopUsers(ctx context.Context, cp *cluster.ControlPlane) error {
	rbac := cp.Client.RbacV1()
	listPods := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "list-pods"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	}
	if _, err := rbac.ClusterRoles().Create(ctx, listPods, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, user := range []string{topUser, viewerUser} {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "list-pods-" + user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: listPods.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	top := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: fleet.AgentNamespace, Name: "top-" + topUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tessera-top"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: topUser}},
	}
	_, err := rbac.RoleBindings(fleet.AgentNamespace).Create(ctx, top, metav1.CreateOptions{})
	return err
}

// result is what a command printed and returned, as a golden file holds it.
func result(stdout, stderr string, err error) string {
	s := stdout
	if stderr != "" {
		s += "--- stderr ---\n" + stderr
	}
	if err != nil {
		s += "--- error ---\n" + err.Error() + "\n"
	}
	return s
}

// kubectlTessera runs the plugin in this process against the test cluster.
func kubectlTessera(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append(args, "--kubeconfig", env.kubeconfig))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// checkGolden compares got with testdata/name.golden, or rewrites it with
// -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("kubectl tessera output differs from %s (-want,+got):\n%s", path, diff)
	}
}

func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		bars bool
	}{
		{name: "nodes", args: []string{"nodes"}},
		{name: "nodes-bars", args: []string{"nodes"}, bars: true},
		{name: "nodes-wide", args: []string{"nodes", "-o", "wide"}},
		{name: "nodes-json", args: []string{"nodes", "-o", "json"}},
		{name: "nodes-yaml", args: []string{"nodes", "-o", "yaml", "-n", "team-b"}},
		{name: "pod-bound", args: []string{"pod", "train"}},
		{name: "pod-bound-init-containers", args: []string{"pod", "video", "-n", "team-b"}},
		{name: "pod-bound-json", args: []string{"pod", "infer-1", "-o", "json"}},
		{name: "pod-pending-too-big", args: []string{"pod", "too-big"}},
		{name: "pod-pending-selector", args: []string{"pod", "wrong-model", "--namespace", "default"}},
		{name: "pod-pending-gpus-fit", args: []string{"pod", "no-such-node"}},
		{name: "pod-pending-json", args: []string{"pod", "too-big", "-o", "json"}},
		{name: "pod-without-gpus", args: []string{"pod", "web"}},
		{name: "pod-not-found", args: []string{"pod", "nope"}},
		{name: "pod-wrong-namespace", args: []string{"pod", "video"}},
		{name: "bad-output-format", args: []string{"nodes", "-o", "xml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bars {
				isTerminal = func(io.Writer) bool { return true }
				defer func() { isTerminal = terminal }()
			}
			checkGolden(t, tc.name, result(kubectlTessera(t, tc.args...)))
		})
	}
}

// TestTop runs top first with no node agent pods, then with an agent pod on
// a100-node whose metrics endpoint the API server's pod proxy reaches: as a
// user bound to the shipped Role tessera-top, and as one who is not.
func TestTop(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "top-no-agents", args: []string{"top", "-A"}},
		{name: "top-no-agents-namespace", args: []string{"top", "-n", "team-b", "-o", "wide"}},
		{name: "top-no-agents-json", args: []string{"top", "-o", "json"}},
		// An install in another namespace (the Helm chart's namespace.name).
		{name: "top-tessera-namespace", args: []string{"top", "-A", "--tessera-namespace", "gpu-system"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGolden(t, tc.name, result(kubectlTessera(t, tc.args...)))
		})
	}
	t.Run("top-agent", func(t *testing.T) {
		serveAgentMetrics(t, "a100-node",
			`# HELP tessera_agent_container_memory_used_mib Memory a container uses on a card.
# TYPE tessera_agent_container_memory_used_mib gauge
tessera_agent_container_memory_used_mib{node="a100-node",namespace="default",pod="infer-0",container="main",card="1"} 5120
tessera_agent_container_memory_used_mib{node="a100-node",namespace="default",pod="train",container="main",card="0"} 70000.4
`)
		checkGolden(t, "top-agent", result(kubectlTessera(t, "top", "-A", "--as", topUser)))
		checkGolden(t, "top-agent-no-token", result(kubectlTessera(t, "top", "-A", "--as", viewerUser)))
		stdout, stderr, err := kubectlTessera(t, "top", "-o", "json", "--as", topUser)
		if err != nil {
			t.Fatalf("top -o json: %v\n%s", err, stderr)
		}
		var list ContainerUsageList
		if err := json.Unmarshal([]byte(stdout), &list); err != nil {
			t.Fatalf("top -o json printed invalid JSON: %v\n%s", err, stdout)
		}
		got := map[string]float64{}
		for _, c := range list.Items {
			if c.MemoryUsedMiB != nil {
				got[c.Pod] = *c.MemoryUsedMiB
			}
		}
		if diff := cmp.Diff(map[string]float64{"infer-0": 5120, "train": 70000.4}, got); diff != "" {
			t.Errorf("memory used (-want,+got):\n%s", diff)
		}
	})
}

// serveAgentMetrics serves metrics as the node agent does — HTTPS, callers
// reviewed by the API server — on port 9402 of a global unicast address of
// this machine (the API server's pod proxy refuses loopback), and creates a
// running node agent pod on node with that address. It skips the test when
// the machine has no such address or the port is taken.
func serveAgentMetrics(t *testing.T, node, metrics string) {
	t.Helper()
	ip := globalUnicastIP()
	if ip == "" {
		t.Skip("no global unicast address on this machine for the API server's pod proxy to reach")
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, agentMetricsPort))
	if err != nil {
		t.Skipf("cannot serve the agent's metrics: %v", err)
	}
	guard, err := serving.NewGuard(env.cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := serving.Certificate("", "", node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serving.Serve(ctx, l, cert, guard.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprint(w, metrics)
		}), serving.Probes{}))
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serving the agent's metrics: %v", err)
		}
	})
	pods := env.cp.Client.CoreV1().Pods(fleet.AgentNamespace)
	agent := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-node-agent-" + node, Labels: map[string]string{"app.kubernetes.io/name": "tessera-node-agent"}},
		Spec:       v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "agent", Image: "tessera-node-agent"}}},
	}
	agent, err = pods.Create(ctx, agent, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pods.Delete(context.Background(), agent.Name, *metav1.NewDeleteOptions(0)) })
	agent.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}}}
	if _, err := pods.UpdateStatus(ctx, agent, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// globalUnicastIP returns an IPv4 global unicast address of this machine, or "".
func globalUnicastIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// terminal is the real isTerminal, restored after tests that replace it.
var terminal = isTerminal

// TestViewerRoles: a user bound to the shipped tessera-viewer roles sees
// what an administrator sees; a user bound to nothing is told which roles
// to ask for.
func TestViewerRoles(t *testing.T) {
	ctx := context.Background()
	rbac := env.cp.Client.RbacV1()
	const oncall = "oncall"
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: oncall}}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "oncall-tessera-viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "tessera-viewer"},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(fleet.AgentNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "oncall-tessera-viewer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tessera-viewer"},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		review, err := env.cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               oncall,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: fleet.AgentNamespace, Verb: "list", Group: "coordination.k8s.io", Resource: "leases"},
		}}, metav1.CreateOptions{})
		return err == nil && review.Status.Allowed, err
	})
	if err != nil {
		t.Fatalf("the viewer bindings did not take effect: %v", err)
	}
	for _, args := range [][]string{{"nodes"}, {"nodes", "-o", "wide"}, {"pod", "too-big"}, {"pod", "video", "-n", "team-b"}} {
		want := result(kubectlTessera(t, args...))
		if got := result(kubectlTessera(t, append(args, "--as", oncall)...)); got != want {
			t.Errorf("kubectl tessera %v as %s (-admin,+%s):\n%s", args, oncall, oncall, cmp.Diff(want, got))
		}
	}
	_, _, err = kubectlTessera(t, "nodes", "--as", "nobody")
	if err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "ClusterRole tessera-viewer") {
		t.Errorf("kubectl tessera nodes as a user without roles: %v, want RBAC's refusal naming tessera-viewer", err)
	}
}

// TestSchedulerResourceNames: the plugin reads pods with the names of the
// scheduler's configuration as its Deployment mounts it — Tessera's in the
// installed base, HAMi's from the hami-names overlay's configuration — and
// says why when it cannot.
func TestSchedulerResourceNames(t *testing.T) {
	ctx := context.Background()
	const ns = "hami-install"
	if _, err := env.cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hami, err := manifests.FS.ReadFile("overlays/hami-names/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: manifests.SchedulerConfigMap + "-h4m1"}, Data: map[string]string{manifests.SchedulerConfigKey: string(hami)}}
	if _, err := env.cp.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "scheduler"}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: schedulerDeployment},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					Containers: []v1.Container{{Name: "scheduler", Image: "tessera-scheduler"}},
					Volumes:    []v1.Volume{{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cm.Name}}}}},
				},
			},
		},
	}
	if _, err := env.cp.Client.AppsV1().Deployments(ns).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns      string
		want    gpuinfo.ResourceNames
		wantErr string
	}{
		{fleet.AgentNamespace, gpuinfo.DefaultResourceNames(), ""},
		{ns, gpuinfo.HAMiResourceNames(), ""},
		{"team-b", gpuinfo.ResourceNames{}, `the scheduler's Deployment team-b/tessera-scheduler: deployments.apps "tessera-scheduler" not found`},
	} {
		got, err := schedulerResourceNames(ctx, env.cp.Client, tc.ns)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.ns, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.ns, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: names (-want,+got):\n%s", tc.ns, diff)
		}
	}
}

// TestVersion: the plugin prints Tessera's version.
func TestVersion(t *testing.T) {
	stdout, _, err := kubectlTessera(t, "version")
	if err != nil || stdout != version.String()+"\n" || !strings.HasPrefix(stdout, "Tessera "+version.Version+" ") {
		t.Errorf("version printed %q (%v), want %q", stdout, err, version.String())
	}
}

// TestPodNominatedAndReserved: a pending pod nominated to a node after a
// preemption shows the pods being evicted there for it, and a GPUReservation
// that does not admit it shows in its answer and in each node's.
func TestPodNominatedAndReserved(t *testing.T) {
	ctx := context.Background()
	const ns = "preempt"
	client := env.cp.Client
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "test-urgent"}, Value: 1000}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reservations := dynamic.NewForConfigOrDie(env.cp.Config).Resource(v1alpha1.Resource)
	reservation := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "tessera.io/v1alpha1", "kind": "GPUReservation", "metadata": map[string]any{"name": "critical-only"},
		"spec": map[string]any{"cards": int64(1), "for": map[string]any{"minPriority": int64(100000)}},
	}}
	if _, err := reservations.Create(ctx, reservation, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = reservations.Delete(ctx, "critical-only", metav1.DeleteOptions{})
		_ = client.SchedulingV1().PriorityClasses().Delete(ctx, "test-urgent", metav1.DeleteOptions{})
		for _, name := range []string{"evicted", "owner-deleted", "urgent"} {
			_ = client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		}
	})
	// Two pods on t4-node being deleted: one by the scheduler's preemption
	// (its DisruptionTarget condition), one by its owner.
	for _, name := range []string{"evicted", "owner-deleted"} {
		p, err := client.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       v1.PodSpec{NodeName: "t4-node", Containers: []v1.Container{{Name: "main", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if name == "evicted" {
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
				Reason: v1.PodReasonPreemptionByScheduler, Message: "tessera-binpack: preempting to accommodate a higher priority pod"})
			if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	urgent := testPod(ns, "urgent", nil, v1.Container{Name: "main", Image: "busybox",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"tessera.io/gpu": resource.MustParse("1")}}})
	urgent.Spec.SchedulerName = "nobody" // left pending, as if waiting for its victim
	urgent.Spec.PriorityClassName = "test-urgent"
	p, err := client.CoreV1().Pods(ns).Create(ctx, urgent, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.NominatedNodeName = "t4-node"
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "pod-nominated", result(kubectlTessera(t, "pod", "urgent", "-n", ns)))
	checkGolden(t, "pod-nominated-json", result(kubectlTessera(t, "pod", "urgent", "-n", ns, "-o", "json")))
}

// TestResize asks for resizes of the video pod's shares through the
// plugin, against the scheduler's resize controller: a pod with two shared
// containers needs -c; a share beyond the container's request is refused,
// and the refusal is the command's error; a resize created without waiting
// is shown by `pod` with where it stands. (It runs after TestCommands,
// whose golden output of the video pod has no resizes.)
func TestResize(t *testing.T) {
	_, _, err := kubectlTessera(t, "resize", "video", "-n", "team-b", "--memory", "2Gi")
	if err == nil || !strings.Contains(err.Error(), "containers encoder, main, warmup hold shares: name one with -c") {
		t.Errorf("without -c: %v", err)
	}
	out, _, err := kubectlTessera(t, "resize", "video", "-n", "team-b", "-c", "encoder", "--memory", "8Gi")
	if err == nil || !strings.Contains(err.Error(), "refused (BeyondRequest)") || !strings.Contains(out, "created") {
		t.Errorf("beyond the request: %q, %v", out, err)
	}
	if _, _, err := kubectlTessera(t, "resize", "video", "-n", "team-b", "-c", "main", "--cores", "100"); err == nil {
		t.Error("--cores 100 was accepted")
	}
	if out, _, err := kubectlTessera(t, "resize", "video", "-n", "team-b", "-c", "main", "--memory", "4Gi", "--no-wait"); err != nil || !strings.Contains(out, "created") {
		t.Fatalf("--no-wait: %q, %v", out, err)
	}
	out, _, err = kubectlTessera(t, "pod", "video", "-n", "team-b")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Resize:") {
			lines = append(lines, l)
		}
	}
	// Created within a second of each other, the two may be listed in
	// either order.
	joined := strings.Join(lines, "\n")
	if len(lines) != 2 || !strings.Contains(joined, "container encoder to 8Gi: Refused (BeyondRequest:") || !strings.Contains(joined, "container main to 4Gi: Pending (WaitingForNodeAgent:") {
		t.Errorf("pod's resizes:\n%s", strings.Join(lines, "\n"))
	}

	// Opted in to right-sizing: said so, and the resizes right-sizing
	// created are marked. An invalid opt-in is named.
	for value, want := range map[string]string{
		"2h":  "Right-size:  on: after 2h0m0s without a higher peak, the memory share shrinks",
		"2 h": `Right-size:  not right-sized: pod team-b/video: annotation tessera.io/right-size="2 h": want "true", "false" or a quiet period`,
	} {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, gpuinfo.RightSizeAnnotation, value)
		if _, err := env.cp.Client.CoreV1().Pods("team-b").Patch(t.Context(), "video", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if out, _, err := kubectlTessera(t, "pod", "video", "-n", "team-b"); err != nil || !strings.Contains(out, want) {
			t.Errorf("right-size %q: %v, output:\n%s\nwant a line starting %q", value, err, out, want)
		}
	}
	resizes := dynamic.NewForConfigOrDie(env.cp.Config).Resource(resizev1alpha1.Resource).Namespace("team-b")
	if _, err := resizes.Create(t.Context(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": resizev1alpha1.Resource.GroupVersion().String(), "kind": resizev1alpha1.Kind,
		"metadata": map[string]any{"name": "video-right-size-x", "labels": map[string]any{resizev1alpha1.RightSizeLabel: "shrink"}},
		"spec":     map[string]any{"podName": "video", "container": "encoder", "memory": "1Gi"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, _, err := kubectlTessera(t, "pod", "video", "-n", "team-b"); err != nil || !strings.Contains(out, "Resize:      video-right-size-x (right-sizing: shrink): container encoder to 1Gi") {
		t.Errorf("a resize of right-sizing: %v, output:\n%s", err, out)
	}
}

// TestPodGated: a pod Kueue holds is said to wait for Kueue's admission,
// not for cards; any other scheduling gate is named too.
func TestPodGated(t *testing.T) {
	if _, err := env.cp.Client.CoreV1().Namespaces().Create(t.Context(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "queued"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gated := testPod("queued", "queued", nil, gpuContainer("main", map[string]int64{"gpu-memory": 4096}))
	gated.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}, {Name: "example.com/approval"}}
	if _, err := env.cp.Client.CoreV1().Pods("queued").Create(t.Context(), gated, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, _, err := kubectlTessera(t, "pod", "queued", "-n", "queued")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Gated:       kueue.x-k8s.io/admission: waiting for Kueue to admit it (its queue's quota), not for cards\n",
		"Gated:       example.com/approval: no scheduler considers the pod until it is removed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
