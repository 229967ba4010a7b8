// Command demo shows Tessera sharing GPUs, with nothing to install: it starts
// a real kube-apiserver and etcd in this process, a fleet of simulated GPU
// nodes, Tessera's scheduler with its profiles, submits the example pods
// from manifests/examples, and prints where every pod landed, card by card.
package main

import (
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
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cluster"
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
}{
	{"a100-node", cluster.A100, 8},
	{"h100-node", cluster.H100, 8},
	{"t4-node", cluster.T4, 4},
	{"l4-node", cluster.L4, 2},
}

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
	if err := quietLogs(logFile); err != nil {
		return err
	}
	fmt.Fprintf(out, "Starting an embedded control plane (etcd + kube-apiserver; logs in %s) and installing manifests/...\n", logFile)
	cp, err := cluster.Start(func(format string, args ...any) { klog.V(2).Infof(format, args...) })
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
		fmt.Fprintf(out, "Node %s: %d x %s (simulated by the node agent)\n", n.name, n.cards, n.spec)
	}
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
	fmt.Fprintln(out, "Scheduler running as its ServiceAccount, with profiles tessera-binpack, tessera-spread and tessera-fragmentation-aware.")

	names, err := submitExamples(ctx, client, o.examples)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Submitted %d example pods from %s.\n\n", len(names), o.examples)
	if err := waitSettled(ctx, client, names); err != nil {
		return err
	}
	table, err := render(ctx, client)
	if err != nil {
		return err
	}
	fmt.Fprint(out, table)
	if o.once {
		return nil
	}
	fmt.Fprintf(out, "\nSubmit your own pods and watch them placed:\n  kubectl --kubeconfig %s apply -f %s\nPress Ctrl-C to stop.\n", kubeconfig, filepath.Join(o.examples, "inference.yaml"))
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

// quietLogs sends the control plane's and scheduler's logs to a file, so the
// terminal shows only the demo.
func quietLogs(path string) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "log_file": path, "one_output": "true"} {
		if err := fs.Set(k, v); err != nil {
			return err
		}
	}
	return nil
}

// submitExamples creates every pod in the YAML files of dir, in file order,
// in the default namespace, and returns their names.
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
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var pod v1.Pod
			if err := dec.Decode(&pod); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if pod.Name == "" {
				continue
			}
			if _, err := client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, &pod, metav1.CreateOptions{}); err != nil {
				return nil, fmt.Errorf("%s: pod %s: %w", f, pod.Name, err)
			}
			names = append(names, pod.Name)
		}
	}
	return names, nil
}

// waitSettled waits until every named pod is bound or marked unschedulable.
func waitSettled(ctx context.Context, client kubernetes.Interface, names []string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p, err := client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Spec.NodeName != "" {
				continue
			}
			settled := false
			for _, c := range p.Status.Conditions {
				settled = settled || (c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse)
			}
			if !settled {
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
