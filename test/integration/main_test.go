// Package integration runs Tessera's scheduler against a real kube-apiserver
// and etcd started in this process, once per test binary.
package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/schedulercmd"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// replicaArgsEnv, when set, makes the test binary run as a scheduler replica
// with these newline-separated arguments instead of running tests.
const replicaArgsEnv = "TESSERA_TEST_SCHEDULER_ARGS"

var controlPlane *cluster.ControlPlane

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(replicaArgsEnv); ok {
		os.Args = append([]string{"tessera-scheduler"}, strings.Split(args, "\n")...)
		os.Exit(cli.Run(schedulercmd.NewCommand()))
	}
	flag.Parse()
	start := time.Now()
	cp, err := cluster.Start(func(format string, args ...any) { klog.V(2).Infof(format, args...) }, cluster.WithGangScheduling())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("control plane ready in %v\n", time.Since(start).Round(time.Millisecond))
	controlPlane = cp
	code := m.Run()
	cp.Stop()
	os.Exit(code)
}

// env is one test's slice of the shared control plane: its own namespace and
// nodes, removed when the test ends. The scheduler runs as its
// ServiceAccount (kubeconfig), with the installed configuration (config).
type env struct {
	tCtx       ktesting.TContext
	client     kubernetes.Interface
	ns         string
	kubeconfig string
	config     string
	nodes      []string
}

func newEnv(t *testing.T) *env {
	tCtx := ktesting.Init(t)
	e := &env{tCtx: tCtx, client: controlPlane.Client}
	ns, err := e.client.CoreV1().Namespaces().Create(tCtx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.ns = ns.Name
	dir := t.TempDir()
	e.kubeconfig, e.config = filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "scheduler-config.yaml")
	if err := controlPlane.WriteSchedulerKubeconfig(e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WriteSchedulerConfig(controlPlane.SchedulerConfig, e.kubeconfig, e.config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

// cleanup removes the test's pods (at once: no kubelet confirms deletions),
// nodes and their agents' Leases (no garbage collector runs in-process), so
// the next test starts from an empty fleet.
func (e *env) cleanup() {
	ctx := context.Background()
	zero := int64(0)
	_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	for _, n := range e.nodes {
		_ = e.client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		_ = e.client.CoordinationV1().Leases(manifests.Namespace).Delete(ctx, gpuinfo.AgentLeasePrefix+n, metav1.DeleteOptions{})
	}
}

// startScheduler starts Tessera's scheduler in-process with the shipped
// configuration; it is stopped when the test ends.
func (e *env) startScheduler(flags ...string) *cluster.Scheduler {
	e.tCtx.Helper()
	s, err := cluster.StartScheduler(e.tCtx, e.config, flags...)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	e.tCtx.Cleanup(s.Stop)
	return s
}

// node creates a simulated GPU node named after the test's namespace; its
// inventory and heartbeat are published by the node agent's code, as the
// node's agent.
func (e *env) node(suffix string, spec cluster.CardSpec, cards int, labels map[string]string) string {
	e.tCtx.Helper()
	name, a := e.quietNode(suffix, spec, cards, labels)
	// Its agent keeps reporting while the test runs, as on a node: the
	// scheduler stops placing on a node whose heartbeat is 40 s old.
	ctx, cancel := context.WithCancel(e.tCtx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	e.tCtx.Cleanup(func() { cancel(); <-done })
	return name
}

// quietNode is node, with an agent that has published once and is left to
// the test.
func (e *env) quietNode(suffix string, spec cluster.CardSpec, cards int, labels map[string]string) (string, *agent.Agent) {
	e.tCtx.Helper()
	name := e.ns + "-" + suffix
	a, err := controlPlane.AddSimulatedNode(e.tCtx, name, spec, cards, labels)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name, a
}

// plainNode creates a node without a GPU inventory, named after the test's
// namespace.
func (e *env) plainNode(suffix string) string {
	e.tCtx.Helper()
	name := e.ns + "-" + suffix
	if _, err := cluster.CreateNode(e.tCtx, e.client, name, nil); err != nil {
		e.tCtx.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name
}

// agentNode creates a node whose kubelet advertises cards cards through the
// agent's device plugin, but whose inventory the test publishes itself.
func (e *env) agentNode(suffix string, cards int) string {
	e.tCtx.Helper()
	name := e.ns + "-" + suffix
	node := cluster.NewNode(name, nil)
	cluster.AdvertiseGPUs(node, cards)
	if _, err := e.client.CoreV1().Nodes().Create(e.tCtx, node, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name
}

// publishInventory writes raw as the node's inventory, as its agent.
func (e *env) publishInventory(node, raw string) {
	e.tCtx.Helper()
	if err := controlPlane.PublishInventory(e.tCtx, node, raw); err != nil {
		e.tCtx.Fatal(err)
	}
}

// podSpec is a pod with one container asking for limits.
func (e *env) podSpec(name, scheduler string, limits map[string]int64) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: v1.PodSpec{
			SchedulerName: scheduler,
			Containers:    []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if len(limits) > 0 {
		pod.Spec.Containers[0].Resources.Limits = v1.ResourceList{}
		for k, v := range limits {
			pod.Spec.Containers[0].Resources.Limits[v1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	return pod
}

// agentClient acts as the node agent of node.
func (e *env) agentClient(node string) kubernetes.Interface {
	e.tCtx.Helper()
	c, err := controlPlane.AgentClient(node)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return c
}

func (e *env) create(pod *v1.Pod) *v1.Pod {
	e.tCtx.Helper()
	created, err := e.client.CoreV1().Pods(e.ns).Create(e.tCtx, pod, metav1.CreateOptions{})
	if err != nil {
		e.tCtx.Fatal(err)
	}
	return created
}

func (e *env) deletePod(name string) {
	e.tCtx.Helper()
	zero := int64(0)
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.tCtx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		e.tCtx.Fatal(err)
	}
}

// waitFor polls every 50ms until cond holds or timeout passes.
func (e *env) waitFor(timeout time.Duration, what string, cond func() (bool, error)) {
	e.tCtx.Helper()
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		e.tCtx.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitBound waits until the named pods are bound and returns them.
func (e *env) waitBound(timeout time.Duration, names ...string) map[string]*v1.Pod {
	e.tCtx.Helper()
	got := map[string]*v1.Pod{}
	var unbound []string
	err := wait.PollUntilContextTimeout(e.tCtx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var pending []string
		for _, n := range names {
			p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				// The last complete reading stays for the report: this
				// Get may have failed only because time ran out.
				return false, err
			}
			if p.Spec.NodeName == "" {
				why := "not tried yet"
				for _, c := range p.Status.Conditions {
					if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
						why = c.Message
					}
				}
				pending = append(pending, n+": "+why)
				continue
			}
			got[n] = p
		}
		unbound = pending
		return len(unbound) == 0, nil
	})
	if err != nil {
		e.tCtx.Fatalf("waiting for pods %v to be bound: %v; unbound:\n%s\nthe namespace's pods:\n%s", names, err, strings.Join(unbound, "\n"), e.podsNow())
	}
	return got
}

// podsNow lists the namespace's pods, one line each with the node, the
// nomination, whether it is terminating and its GPU assignment, for a
// failing test's report.
func (e *env) podsNow() string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.tCtx), 10*time.Second)
	defer cancel()
	pods, err := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "%s priority=%d node=%q nominated=%q terminating=%t assignment=%s\n", p.Name, priority(&p), p.Spec.NodeName, p.Status.NominatedNodeName,
			p.DeletionTimestamp != nil, p.Annotations[gpuinfo.AssignmentAnnotation])
	}
	// The claims of the namespace, and any other allocated on its nodes'
	// devices: where each is allocated and for whom.
	claims, err := e.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + err.Error()
	}
	for _, c := range claims.Items {
		var devices, reserved []string
		ours := c.Namespace == e.ns
		if a := c.Status.Allocation; a != nil {
			for _, r := range a.Devices.Results {
				devices = append(devices, r.Pool+"/"+r.Device)
				ours = ours || strings.HasPrefix(r.Pool, e.ns+"-")
			}
		}
		if !ours {
			continue
		}
		for _, r := range c.Status.ReservedFor {
			reserved = append(reserved, r.Name)
		}
		fmt.Fprintf(&b, "claim %s/%s allocated=%v reservedFor=%v deleting=%t\n", c.Namespace, c.Name, devices, reserved, c.DeletionTimestamp != nil)
	}
	return b.String()
}

// waitUnschedulable waits for the pod's PodScheduled=False condition and
// returns its message.
func (e *env) waitUnschedulable(name string) string {
	e.tCtx.Helper()
	var msg string
	e.waitFor(30*time.Second, "pod "+name+" to be marked unschedulable", func() (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.tCtx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				msg = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}

// assignment decodes a bound pod's assignment annotation.
func assignment(t testing.TB, pod *v1.Pod) *gpuinfo.Assignment {
	t.Helper()
	a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		t.Fatalf("pod %s: %v", pod.Name, err)
	}
	return a
}

// placement is a pod's node and the card indices of its main container.
type placement struct {
	Node  string
	Cards []int
}

func placementOf(t testing.TB, pod *v1.Pod) placement {
	p := placement{Node: pod.Spec.NodeName}
	for _, c := range assignment(t, pod).Containers["main"] {
		p.Cards = append(p.Cards, c.Index)
	}
	return p
}

// TestSchedulerFeatureGates: the suite's scheduler runs with the gates its
// Deployment sets: asynchronous preemption off.
func TestSchedulerFeatureGates(t *testing.T) {
	if utilfeature.DefaultFeatureGate.Enabled(features.SchedulerAsyncPreemption) {
		t.Errorf("SchedulerAsyncPreemption is on; the Deployment sets --feature-gates=%s", manifests.SchedulerFeatureGates)
	}
}
