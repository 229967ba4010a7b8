// Command demo shows Tessera sharing GPUs, with nothing to install: it starts
// a real kube-apiserver and etcd in this process, a fleet of simulated GPU
// nodes, Tessera's scheduler with its profiles, submits the example pods
// from manifests/examples, and prints where every pod landed, card by card.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/manifests"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// options are the demo's flags.
type options struct {
	once     bool
	examples string
	workDir  string
}

// fleet is the demo's simulated GPU nodes.
var fleet = []struct {
	name  string
	spec  cluster.CardSpec
	cards int
	// about describes the cards where spec alone would not.
	about string
}{
	{"a100-node", cluster.A100, 8, ""},
	{"h100-node", cluster.H100 + ",topology=" + topology.NVLinkQuads, 8,
		"8 x H100-80GB as two NVLink quads (cards 0-3 and 4-7), one per CPU socket"},
	{"t4-node", cluster.T4, 4, ""},
	{"l4-node", cluster.L4, 2, ""},
	{"a100-mig-node", "A100-40GB:mig=3g.20gb+2g.10gb+1g.5gb,1xA100-40GB:mig-dynamic=", 1,
		"2 x A100-40GB in MIG mode: card 0 cut by its operator (3g.20gb, 2g.10gb, 1g.5gb), card 1 dynamic (--dynamic-mig-cards=1)"},
}

// draNode is the demo's node whose cards are DRA devices.
const draNode = "l4-dra-node"

func main() {
	var o options
	flag.BoolVar(&o.once, "once", false, "print the placement once and exit instead of running until interrupted")
	flag.StringVar(&o.examples, "examples", "manifests/examples", "directory of example pod manifests to submit")
	flag.StringVar(&o.workDir, "work-dir", filepath.Join(os.TempDir(), "tessera-demo"), "where the kubeconfig and logs are written")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run is the demo; its output goes to out, the servers' logs to a file.
func run(ctx context.Context, o options, out io.Writer) error {
	if err := os.MkdirAll(o.workDir, 0o700); err != nil {
		return err
	}
	logFile := filepath.Join(o.workDir, "demo.log")
	if err := cluster.LogToFile(logFile); err != nil {
		return err
	}
	fmt.Fprintf(out, "Starting an embedded control plane (etcd + kube-apiserver; logs in %s) and installing manifests/...\n", logFile)
	cp, err := cluster.Start(func(format string, args ...any) { klog.V(2).Infof(format, args...) }, cluster.WithGangScheduling())
	if err != nil {
		return err
	}
	defer cp.Stop()
	client := cp.Client
	agents, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	for _, n := range fleet {
		a, err := cp.AddSimulatedNode(ctx, n.name, n.spec, n.cards, nil)
		if err != nil {
			return err
		}
		go a.Run(agents) // keeps the heartbeat Lease fresh while the demo runs
		// Its agent applies resizes of the shares on it.
		if err := cp.RunResizes(agents, n.name, filepath.Join(o.workDir, "vgpu", n.name)); err != nil {
			return err
		}
		about := fmt.Sprintf("%d x %s", n.cards, n.spec)
		if n.about != "" {
			about = n.about
		}
		fmt.Fprintf(out, "Node %s: %s (simulated by the node agent)\n", n.name, about)
	}
	draAgent, _, err := cp.AddDRANode(agents, draNode, cluster.L4, 2, filepath.Join(o.workDir, "dra"))
	if err != nil {
		return err
	}
	go draAgent.Run(agents)
	fmt.Fprintf(out, "Node %s: 2 x %s, served as DRA devices for resource claims (the node agent's --dra)\n", draNode, cluster.L4)
	if _, err := cluster.CreateNode(ctx, client, "cpu-node", nil); err != nil {
		return err
	}
	kubeconfig := filepath.Join(o.workDir, "kubeconfig")
	schedulerKubeconfig := filepath.Join(o.workDir, "scheduler-kubeconfig")
	schedulerConfig := filepath.Join(o.workDir, "scheduler-config.yaml")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	if err := cp.WriteSchedulerKubeconfig(schedulerKubeconfig); err != nil {
		return err
	}
	if err := cluster.WriteSchedulerConfig(cp.SchedulerConfig, schedulerKubeconfig, schedulerConfig); err != nil {
		return err
	}
	sched, err := cluster.StartScheduler(ctx, schedulerConfig)
	if err != nil {
		return err
	}
	defer sched.Stop()
	// The simulated nodes' kubelets confirm deletions (preemption victims).
	kubeletCtx, stopKubelet := context.WithCancel(ctx)
	kubelet, kubeletDone := cluster.StartKubelet(kubeletCtx, client, metav1.NamespaceDefault)
	defer func() { stopKubelet(); <-kubeletDone }()
	fmt.Fprintln(out, "Scheduler running as its ServiceAccount, with profiles tessera-binpack, tessera-spread and tessera-fragmentation-aware.")

	// As an operator would: the examples' critical pod takes tessera-critical,
	// which the admission policy tessera-high-priority allows only in
	// namespaces so labelled.
	allow := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, manifests.HighPriorityLabel, manifests.HighPriorityAllowed)
	if _, err := client.CoreV1().Namespaces().Patch(ctx, metav1.NamespaceDefault, types.MergePatchType, []byte(allow), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling namespace %s for high priority: %w", metav1.NamespaceDefault, err)
	}
	fmt.Fprintf(out, "Namespace %s labelled %s=%s: its pods may take tessera-critical.\n", metav1.NamespaceDefault, manifests.HighPriorityLabel, manifests.HighPriorityAllowed)
	names, err := submitExamples(ctx, client, o.examples)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Submitted %d example pods from %s.\n\n", len(names), o.examples)
	waitPreemptionsRecorded(ctx, client, kubelet)
	table, err := render(ctx, client)
	if err != nil {
		return err
	}
	fmt.Fprint(out, table)
	if err := resizeNotebook(ctx, cp, out); err != nil {
		return err
	}
	if table, err = render(ctx, client); err != nil {
		return err
	}
	fmt.Fprint(out, "\n"+table)
	if o.once {
		return nil
	}
	fmt.Fprintf(out, "\nLook at the fleet with Tessera's kubectl plugin (only Go needed):\n"+
		"  go run ./cmd/kubectl-tessera --kubeconfig %[1]s nodes\n"+
		"  go run ./cmd/kubectl-tessera --kubeconfig %[1]s pod too-big\n"+
		"  go run ./cmd/kubectl-tessera --kubeconfig %[1]s resize notebook-alice --memory 8Gi\n"+
		"Submit your own pods and watch them placed (with kubectl installed):\n"+
		"  kubectl --kubeconfig %[1]s apply -f %[2]s\nPress Ctrl-C to stop.\n", kubeconfig, filepath.Join(o.examples, "inference.yaml"))
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\nShutting down.")
			return nil
		case <-time.After(2 * time.Second):
		}
		next, err := render(ctx, client)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if next != table {
			table = next
			fmt.Fprintf(out, "\n--- %s ---\n%s", time.Now().Format(time.TimeOnly), table)
		}
	}
}

// submitExamples creates the objects in the YAML files of dir — pods, pod
// groups and resource claims, in the default namespace, and the priority classes they use — file by file in
// name order, waiting for each file's pods to settle before the next (so
// that a later file can preempt an earlier one's pods), and returns the pods'
// names.
func submitExamples(ctx context.Context, client kubernetes.Interface, dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no example manifests in %s", dir)
	}
	sort.Strings(files)
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var filePods []string
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			doc, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			switch o := obj.(type) {
			case *v1.Pod:
				if err := createPod(ctx, client, o); err != nil {
					return nil, fmt.Errorf("%s: pod %s: %w", f, o.Name, err)
				}
				filePods = append(filePods, o.Name)
			case *schedulingv1beta1.PodGroup:
				if _, err := client.SchedulingV1beta1().PodGroups(metav1.NamespaceDefault).Create(ctx, o, metav1.CreateOptions{}); err != nil {
					return nil, fmt.Errorf("%s: pod group %s: %w", f, o.Name, err)
				}
			case *resourceapi.ResourceClaim:
				if _, err := client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Create(ctx, o, metav1.CreateOptions{}); err != nil {
					return nil, fmt.Errorf("%s: resource claim %s: %w", f, o.Name, err)
				}
			case *schedulingv1.PriorityClass:
				if _, err := client.SchedulingV1().PriorityClasses().Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return nil, fmt.Errorf("%s: priority class %s: %w", f, o.Name, err)
				}
			default:
				return nil, fmt.Errorf("%s: the demo submits pods, pod groups, resource claims and priority classes, not %T", f, obj)
			}
		}
		if err := waitSettled(ctx, client, filePods); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		names = append(names, filePods...)
	}
	return names, nil
}

// createPod creates the pod in the default namespace. The API server's
// Priority admission reads priority classes from an informer, so a pod naming
// a class created a moment ago may be refused until the informer has seen it;
// such refusals are retried for a few seconds.
func createPod(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) error {
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, lastErr = client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod, metav1.CreateOptions{})
		classNotSeenYet := apierrors.IsForbidden(lastErr) && pod.Spec.PriorityClassName != ""
		return !classNotSeenYet, nil
	})
	if lastErr != nil {
		return lastErr
	}
	return err
}

// waitPreemptionsRecorded waits until the scheduler's Preempted Events, which
// it writes asynchronously, name every pod the kubelet saw evicted, so the
// first table lists them all. It gives up after a few seconds: the table is
// then drawn without the missing ones (events are best effort).
func waitPreemptionsRecorded(ctx context.Context, client kubernetes.Interface, kubelet *cluster.Kubelet) {
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evicted, _ := kubelet.Terminated()
		recorded, err := cluster.Preemptions(ctx, client, metav1.NamespaceDefault)
		if err != nil {
			return false, nil
		}
		victims := map[string]bool{}
		for _, p := range recorded {
			victims[p.Victim] = true
		}
		for _, pod := range evicted {
			if !victims[pod] {
				return false, nil
			}
		}
		return true, nil
	})
}

// waitSettled waits until every named pod is bound, marked unschedulable
// with no preemption under way for it, or gone (a preemption victim).
func waitSettled(ctx context.Context, client kubernetes.Interface, names []string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p, err := client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return false, err
			}
			if p.Spec.NodeName != "" {
				continue
			}
			settled := p.Status.NominatedNodeName == ""
			unschedulable := false
			for _, c := range p.Status.Conditions {
				unschedulable = unschedulable || (c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse)
			}
			if !settled || !unschedulable {
				return false, nil
			}
		}
		return true, nil
	})
}

func render(ctx context.Context, client kubernetes.Interface) (string, error) {
	var b bytes.Buffer
	err := cluster.WriteTable(ctx, client, &b)
	return b.String(), err
}

// resizeNotebook gives back half of an idle notebook's card memory with a
// GPUShareResize, without restarting it, and says what became of it.
func resizeNotebook(ctx context.Context, cp *cluster.ControlPlane, out io.Writer) error {
	const pod, name = "notebook-alice", "notebook-alice-idle"
	fmt.Fprintf(out, "\nThe idle %s gives half its share back (GPUShareResize %s: 4Gi, no restart)...\n", pod, name)
	client, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	resizes := client.Resource(resizev1alpha1.Resource).Namespace(metav1.NamespaceDefault)
	if _, err := resizes.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": resizev1alpha1.Resource.GroupVersion().String(), "kind": resizev1alpha1.Kind,
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"podName": pod, "container": "jupyter", "memory": "4Gi"},
	}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("resizing %s: %w", pod, err)
	}
	var r resizev1alpha1.GPUShareResize
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := resizes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
			return false, err
		}
		return r.Decided(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the resize of %s: %w", pod, err)
	}
	for _, c := range r.Status.Conditions {
		if (c.Type == resizev1alpha1.ConditionApplied || c.Type == resizev1alpha1.ConditionRefused) && c.Status == metav1.ConditionTrue {
			fmt.Fprintf(out, "GPUShareResize %s %s: %s\n", name, strings.ToLower(c.Type), c.Message)
		}
	}
	return nil
}
