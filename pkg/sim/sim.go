// Package sim replays a GPU trace through the real kube-scheduler with
// Tessera's plugin and a shipped profile, following the FGD artifact's
// protocol, and records GPU allocation against arrived workload.
//
// The scheduler is kube-scheduler's own (scheduler.New and its scheduling
// loop, queue, cache and framework) built from manifests/base/scheduler/scheduler-config.yaml;
// only the API server is replaced, by client-go's fake clientset with the
// binding subresource implemented, so a replay of ten thousand pods takes
// seconds rather than an apiserver's write latency per pod. Replays are
// deterministic for a seed: nodes are added in trace order, Filter runs on
// one goroutine (kube-scheduler breaks score ties by the order it found
// feasible nodes in, which parallel Filter makes racy), GPUShare's PreFilter
// returns no node set (kube-scheduler would iterate it in map order;
// orderedGPUShare) and every node is scored, as in the artifact.
package sim

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubernetes/pkg/scheduler"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// nodeBatch is how many nodes are created before waiting for the scheduler
// to see them: the fake clientset's watch buffers 100 events.
const nodeBatch = 50

// taskTimeout bounds the wait for one task's outcome.
const taskTimeout = time.Minute

// Config is one replay.
type Config struct {
	// Nodes are the cluster; nodes without GPUs are left out.
	Nodes []trace.Node
	// Tasks is the task list; Arrivals shuffles and pads it.
	Tasks []trace.Task
	// Seed selects the arrival order.
	Seed uint64
	// Profile is the shipped scheduler profile that places the pods.
	Profile string
	// Progress, when set, is called after each task with the number done
	// and the total.
	Progress func(done, total int)
}

// Result is a replay's outcome.
type Result struct {
	Profile   string
	Seed      uint64
	TotalGPUs int
	// Allocation is the GPU allocation in percent of capacity, indexed by
	// arrived GPU workload in percent of capacity (0..MaxArrivedPercent).
	Allocation []float64
	// Tasks is how many tasks arrived; Placed how many got a node.
	Tasks, Placed int
	// Nodes is, per arrival, the node its pod was bound to, or "" when it
	// was not placed: two replays of a seed agree on every entry.
	Nodes []string
	// Errors counts tasks that failed with a scheduler error rather than for
	// lack of room; a correct replay has none.
	Errors  int
	Elapsed time.Duration
}

// Unallocated is the headline figure: the GPU share left unallocated when the
// arrived workload equals the cluster's capacity.
func (r *Result) Unallocated() float64 { return 100 - r.Allocation[100] }

// Run replays the trace once.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	nodes := GPUNodes(cfg.Nodes)
	capacity := CapacityMilli(nodes)
	if capacity == 0 {
		return nil, fmt.Errorf("the trace has no GPU nodes")
	}
	arrivals := Arrivals(cfg.Tasks, capacity, cfg.Seed)
	schedCfg, err := LoadProfile(cfg.Profile)
	if err != nil {
		return nil, err
	}

	client := fake.NewSimpleClientset()
	client.PrependReactor("create", "pods", bindReactor(client.Tracker()))
	informers := scheduler.NewInformerFactory(client, 0, nil)
	recorders := profile.RecorderFactory(func(string) events.EventRecorderLogger { return &events.FakeRecorder{} })
	sched, err := scheduler.New(ctx, client, informers, nil, recorders,
		scheduler.WithProfiles(schedCfg.Profiles...),
		scheduler.WithPercentageOfNodesToScore(ptr.To[int32](100)),
		scheduler.WithParallelism(1),
		scheduler.WithFrameworkOutOfTreeRegistry(registry),
	)
	if err != nil {
		return nil, fmt.Errorf("building the scheduler: %w", err)
	}
	informers.Start(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())
	go sched.Run(ctx)
	if err := addNodes(ctx, client, sched, nodes); err != nil {
		return nil, err
	}

	watcher, err := client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	defer watcher.Stop()
	res := &Result{Profile: cfg.Profile, Seed: cfg.Seed, TotalGPUs: int(capacity / 1000), Tasks: len(arrivals)}
	c := newCurve(capacity)
	for i, t := range arrivals {
		node, schedErr, err := replayTask(ctx, client, watcher, pod(t, i, cfg.Profile))
		if err != nil {
			return nil, err
		}
		placed := node != ""
		if placed {
			res.Placed++
		}
		res.Nodes = append(res.Nodes, node)
		if schedErr {
			res.Errors++
		}
		c.arrive(t, placed)
		if cfg.Progress != nil {
			cfg.Progress(i+1, len(arrivals))
		}
	}
	if !c.complete() {
		return nil, fmt.Errorf("the arrivals reached %d%% of capacity only", c.next-1)
	}
	res.Allocation = c.points
	res.Elapsed = time.Since(start)
	return res, nil
}

// addNodes creates the nodes in trace order, a batch at a time, waiting for
// the scheduler's cache to hold each batch so nodes keep that order.
func addNodes(ctx context.Context, client *fake.Clientset, sched *scheduler.Scheduler, nodes []trace.Node) error {
	for i, n := range nodes {
		obj, err := node(n)
		if err != nil {
			return err
		}
		if _, err := client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return err
		}
		if (i+1)%nodeBatch != 0 && i+1 != len(nodes) {
			continue
		}
		want := i + 1
		err = wait.PollUntilContextTimeout(ctx, time.Millisecond, taskTimeout, true, func(context.Context) (bool, error) {
			return sched.Cache.NodeCount() >= want, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for the scheduler to see %d nodes: %w", want, err)
		}
	}
	return nil
}

// replayTask creates the task's pod and waits until it is bound (returning
// its node) or found unschedulable. An unschedulable pod is deleted: the
// protocol skips tasks that do not fit, and with no departures they never
// will.
func replayTask(ctx context.Context, client *fake.Clientset, watcher watch.Interface, p *v1.Pod) (node string, schedErr bool, err error) {
	if _, err := client.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return "", false, err
	}
	timeout := time.NewTimer(taskTimeout)
	defer timeout.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", false, ctx.Err()
		case <-timeout.C:
			return "", false, fmt.Errorf("pod %s: no scheduling outcome within %s", p.Name, taskTimeout)
		case ev, ok := <-watcher.ResultChan():
			if !ok {
				return "", false, fmt.Errorf("pod watch closed")
			}
			got, isPod := ev.Object.(*v1.Pod)
			if !isPod || got.Name != p.Name || ev.Type == watch.Deleted {
				continue
			}
			if got.Spec.NodeName != "" {
				return got.Spec.NodeName, false, nil
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
					err := client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
					return "", cond.Reason != v1.PodReasonUnschedulable, err
				}
			}
		}
	}
}

// registry holds the plugins replays add to kube-scheduler's.
var registry = frameworkruntime.Registry{
	gpushare.Name:           newOrderedGPUShare,
	gpushare.PreemptionName: gpushare.NewPreemption,
	randomScoreName:         newRandomScore,
}

// profileNames lists the profiles of a configuration.
func profileNames(cfg *schedconfig.KubeSchedulerConfiguration) []string {
	names := make([]string, len(cfg.Profiles))
	for i, p := range cfg.Profiles {
		names[i] = p.SchedulerName
	}
	return names
}
