package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// vanillaGPU is the extended resource vanilla kube-scheduler counts whole
// cards with, as a device plugin would advertise them.
const vanillaGPU v1.ResourceName = "nvidia.com/gpu"

// vanillaConfig is kube-scheduler with the same client limits as Tessera's
// benchmark configuration and two profiles: its default, which spreads, and
// one that packs (NodeResourcesFit's MostAllocated, GPUs included).
const vanillaConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 5000
  burst: 5000
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: default-scheduler
  - schedulerName: vanilla-binpack
    pluginConfig:
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
            resources:
              - {name: cpu, weight: 1}
              - {name: memory, weight: 1}
              - {name: nvidia.com/gpu, weight: 1}
`

// throughputMix is the benchmark's pod mix, largest first so that every pod
// fits on both sides: a share of a card for Tessera is one whole card for
// vanilla. Each entry is (cards, percent of a card; 0 = whole cards, weight).
var throughputMix = []struct {
	cards   int64
	percent int64
	weight  int
}{{8, 0, 2}, {4, 0, 3}, {2, 0, 10}, {1, 0, 35}, {1, 50, 25}, {1, 25, 25}}

// throughputSizes are the benchmark's fleets and pod counts. At 1,000 nodes
// it schedules 5,000 pods, not 10,000: as whole cards for vanilla the mix
// needs 1.33 cards per pod, more than the 8,000 cards the fleet has.
var throughputSizes = flag.String("throughput-sizes", "1000x5000,5000x10000", "nodes×pods of BenchmarkThroughput, comma-separated")

// throughputProcess runs each side's scheduler as a process of its own, to
// measure its peak memory.
var throughputProcess = flag.Bool("throughput-process", false, "run each side's scheduler as its own process and report its peak RSS (no per-extension-point times then)")

// throughputOnly runs one side alone, for profiling it.
var throughputOnly = flag.String("throughput-only", "", "run only this side of BenchmarkThroughput (tessera-binpack or vanilla-binpack), to profile it")

type fleetSize struct{ nodes, pods int }

func parseSizes(s string) ([]fleetSize, error) {
	var sizes []fleetSize
	for _, part := range strings.Split(s, ",") {
		var f fleetSize
		if _, err := fmt.Sscanf(part, "%dx%d", &f.nodes, &f.pods); err != nil {
			return nil, fmt.Errorf("-throughput-sizes %q: %w", s, err)
		}
		sizes = append(sizes, f)
	}
	return sizes, nil
}

// side is one scheduler profile under test.
type side struct {
	name, profile, config string
	// pod builds the i-th pod asking for cards (a share when percent > 0).
	pod func(name string, cards, percent int64) *v1.Pod
}

// BenchmarkThroughput schedules the same mixed pods with Tessera's
// tessera-binpack profile (the shipped configuration) and with vanilla
// kube-scheduler packing whole cards through NodeResourcesFit
// (MostAllocated), in interleaved rounds on one control plane, and reports
// pods bound per second for each and their ratio (the sides take turns to go
// first). Both sides pack: packing
// leaves more nodes infeasible, so kube-scheduler filters more nodes to find
// its quota of feasible ones, and comparing a packing profile with vanilla's
// spreading default would measure that rather than the plugin. (Spread
// profiles are not compared: spreading shares over every card leaves no whole
// card for the whole-card pods that come later, by design, so the mix would
// not all fit.) Run with `make bench-throughput` (see docs/performance.md);
// it is a benchmark, not part of the test suite.
func BenchmarkThroughput(b *testing.B) {
	sizes, err := parseSizes(*throughputSizes)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range sizes {
		b.Run(fmt.Sprintf("nodes=%d/pods=%d", size.nodes, size.pods), func(b *testing.B) {
			tCtx := ktesting.Init(b)
			sides := throughputSides(tCtx, b.TempDir())
			nodes := createThroughputNodes(tCtx, size.nodes)
			defer deleteNodes(controlPlane.Client, nodes)
			defer keepReporting(tCtx, nodes)()
			rates, peaks := map[string][]float64{}, map[string][]float64{}
			if *throughputOnly != "" {
				sides = slices.DeleteFunc(sides, func(s side) bool { return s.name != *throughputOnly })
				if len(sides) == 0 {
					b.Fatalf("-throughput-only %q: no such side", *throughputOnly)
				}
			}
			for i := 0; i < b.N; i++ {
				// Odd rounds run the sides in reverse, so that a machine
				// slowing down or speeding up during the run favours neither.
				order := slices.Clone(sides)
				if i%2 == 1 {
					slices.Reverse(order)
				}
				for _, s := range order {
					r := throughputRound(tCtx, s, size.pods)
					rates[s.name] = append(rates[s.name], r.rate)
					if r.peakRSS > 0 {
						peaks[s.name] = append(peaks[s.name], float64(r.peakRSS)/(1<<20))
						fmt.Printf("throughput: %s round %d of %d, %s: %.1f pods/s; peak RSS %d MiB\n", b.Name(), i+1, b.N, s.name, r.rate, r.peakRSS>>20)
						continue
					}
					fmt.Printf("throughput: %s round %d of %d, %s: %.1f pods/s; mean per pod: %s\n", b.Name(), i+1, b.N, s.name, r.rate, r.latencies)
				}
			}
			for _, s := range sides {
				b.ReportMetric(mean(rates[s.name]), s.name+"-pods/s")
				if len(peaks[s.name]) > 0 {
					b.ReportMetric(slices.Max(peaks[s.name]), s.name+"-peak-RSS-MiB")
				}
			}
			if len(sides) == 2 {
				b.ReportMetric(mean(rates["tessera-binpack"])/mean(rates["vanilla-binpack"]), "ratio")
			}
		})
	}
}

// throughputSides are Tessera's scheduler, as its ServiceAccount, and vanilla
// kube-scheduler, as the user system:kube-scheduler that upstream's RBAC
// binds: both sides' requests go through RBAC and impersonation alike.
func throughputSides(tCtx ktesting.TContext, dir string) []side {
	tesseraKubeconfig, vanillaKubeconfig := filepath.Join(dir, "tessera-kubeconfig"), filepath.Join(dir, "vanilla-kubeconfig")
	tesseraConfig, vanillaConfigFile := filepath.Join(dir, "tessera.yaml"), filepath.Join(dir, "vanilla.yaml")
	if err := controlPlane.WriteSchedulerKubeconfig(tesseraKubeconfig); err != nil {
		tCtx.Fatal(err)
	}
	vanillaUser := rest.CopyConfig(controlPlane.Config)
	vanillaUser.Impersonate.UserName = user.KubeScheduler
	if err := cluster.WriteKubeconfig(vanillaUser, vanillaKubeconfig); err != nil {
		tCtx.Fatal(err)
	}
	if err := cluster.WriteSchedulerConfig(controlPlane.SchedulerConfig, tesseraKubeconfig, tesseraConfig); err != nil {
		tCtx.Fatal(err)
	}
	if err := os.WriteFile(vanillaConfigFile, fmt.Appendf(nil, vanillaConfig, vanillaKubeconfig), 0o600); err != nil {
		tCtx.Fatal(err)
	}
	names := gpuinfo.DefaultResourceNames()
	tesseraPod := func(profile string) func(string, int64, int64) *v1.Pod {
		return func(name string, cards, percent int64) *v1.Pod {
			limits := v1.ResourceList{names.GPU: *resource.NewQuantity(cards, resource.DecimalSI)}
			if percent > 0 {
				limits = v1.ResourceList{
					names.MemoryPercent: *resource.NewQuantity(percent, resource.DecimalSI),
					names.Cores:         *resource.NewQuantity(percent, resource.DecimalSI),
				}
			}
			return throughputPod(name, profile, limits)
		}
	}
	vanillaPod := func(profile string) func(string, int64, int64) *v1.Pod {
		return func(name string, cards, _ int64) *v1.Pod {
			return throughputPod(name, profile, v1.ResourceList{vanillaGPU: *resource.NewQuantity(cards, resource.DecimalSI)})
		}
	}
	return []side{
		{name: "tessera-binpack", profile: "tessera-binpack", config: tesseraConfig, pod: tesseraPod("tessera-binpack")},
		{name: "vanilla-binpack", profile: "vanilla-binpack", config: vanillaConfigFile, pod: vanillaPod("vanilla-binpack")},
	}
}

func throughputPod(name, scheduler string, limits v1.ResourceList) *v1.Pod {
	limits[v1.ResourceCPU] = resource.MustParse("100m")
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PodSpec{
			SchedulerName: scheduler,
			Containers:    []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Limits: limits, Requests: limits}}},
		},
	}
}

// createThroughputNodes creates n nodes of 8 A100s, each with the vanilla
// extended resource and Tessera's inventory, published as its agent.
func createThroughputNodes(tCtx ktesting.TContext, n int) []string {
	names := make([]string, n)
	err := parallel(n, func(i int) error {
		names[i] = fmt.Sprintf("tp-%05d", i)
		node := cluster.NewNode(names[i], nil)
		cluster.AdvertiseGPUs(node, 8)
		node.Status.Capacity[vanillaGPU] = resource.MustParse("8")
		node.Status.Allocatable[vanillaGPU] = resource.MustParse("8")
		if _, err := controlPlane.Client.CoreV1().Nodes().Create(tCtx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
		return controlPlane.PublishInventory(tCtx, names[i], testutil.MustEncode(testutil.Inventory(names[i], "NVIDIA A100-SXM4-80GB", 81920, 8)))
	})
	if err != nil {
		tCtx.Fatal(err)
	}
	return names
}

// keepReporting renews the nodes' heartbeat Leases every 10 s, as their
// agents do (the scheduler keeps GPU pods off a node whose Lease is 40 s
// old), until the returned function is called. Both sides run with this
// load on the API server: the agents' renewals are part of a cluster.
func keepReporting(tCtx ktesting.TContext, nodes []string) (stop func()) {
	ctx, cancel := context.WithCancel(tCtx)
	done := make(chan struct{})
	publishers := make([]*publish.Publisher, len(nodes))
	for i, n := range nodes {
		publishers[i] = &publish.Publisher{Client: controlPlane.Client, NodeName: n, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = parallel(len(publishers), func(i int) error { return publishers[i].Heartbeat(ctx) })
			}
		}
	}()
	return func() { cancel(); <-done }
}

func deleteNodes(client kubernetes.Interface, names []string) {
	_ = parallel(len(names), func(i int) error {
		return client.CoreV1().Nodes().Delete(context.Background(), names[i], metav1.DeleteOptions{})
	})
}

// roundResult is one side's round: pods bound per second, and either the
// mean latency of each extension point (scheduler in this process) or the
// scheduler's peak RSS in bytes (scheduler in its own process).
type roundResult struct {
	rate      float64
	latencies string
	peakRSS   int64
}

// throughputRound creates the pods in a fresh namespace, starts the side's
// scheduler and measures pods bound per second from the first binding to
// the last, then stops the scheduler and deletes the pods. With the scheduler
// in this process it also returns the mean latency of each extension point
// during the round, from the scheduler's own metrics; with
// -throughput-process, the scheduler process's peak RSS once every pod is
// bound.
func throughputRound(tCtx ktesting.TContext, s side, n int) roundResult {
	created, err := controlPlane.Client.CoreV1().Namespaces().Create(tCtx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tp-" + s.name + "-"}}, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	ns := created.Name
	client := fastClient(tCtx)
	total := 0
	for _, m := range throughputMix {
		total += m.weight
	}
	var specs []*v1.Pod
	for _, m := range throughputMix {
		for j := 0; j < n*m.weight/total; j++ {
			specs = append(specs, s.pod(fmt.Sprintf("p-%05d", len(specs)), m.cards, m.percent))
		}
	}
	if err := parallel(len(specs), func(i int) error {
		_, err := client.CoreV1().Pods(ns).Create(tCtx, specs[i], metav1.CreateOptions{})
		return err
	}); err != nil {
		tCtx.Fatal(err)
	}
	bound := watchBindings(tCtx, client, ns)
	var result roundResult
	before := extensionPointTotals(s.profile)
	stop := startThroughputScheduler(tCtx, s)
	defer stop()
	first, last, err := bound.wait(tCtx, len(specs))
	if err != nil {
		tCtx.Fatalf("%s: %v; for example: %s", s.name, err, unboundReasons(tCtx, client, ns))
	}
	if result.peakRSS = stop(); result.peakRSS == 0 {
		result.latencies = extensionPointMeans(before, extensionPointTotals(s.profile))
	}
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(tCtx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		tCtx.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(tCtx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		left, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(left.Items) == 0, err
	})
	if err != nil {
		tCtx.Fatalf("deleting the round's pods: %v", err)
	}
	result.rate = float64(len(specs)-1) / last.Sub(first).Seconds()
	return result
}

// startThroughputScheduler starts the side's scheduler, in this process or,
// with -throughput-process, as a process of its own. The returned stop
// stops it (once; later calls return 0) and returns its peak RSS in bytes,
// or 0 for a scheduler in this process.
func startThroughputScheduler(tCtx ktesting.TContext, s side) (stop func() int64) {
	var once sync.Once
	if !*throughputProcess {
		sched, err := cluster.StartScheduler(tCtx, s.config)
		if err != nil {
			tCtx.Fatal(err)
		}
		return func() int64 {
			once.Do(sched.Stop)
			return 0
		}
	}
	r := startReplica(tCtx, s.name, "--config="+s.config, "--secure-port=0", "--leader-elect=false")
	return func() (peak int64) {
		once.Do(func() {
			var err error
			if peak, err = r.peakRSS(); err != nil {
				tCtx.Error(err)
			}
			r.kill()
		})
		return peak
	}
}

// bindings records when each pod of a namespace was first seen bound, from
// an informer (which survives watch restarts).
type bindings struct {
	mu    sync.Mutex
	times map[string]time.Time
}

func watchBindings(tCtx ktesting.TContext, client kubernetes.Interface, ns string) *bindings {
	b := &bindings{times: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	record := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
			b.mu.Lock()
			if _, seen := b.times[p.Name]; !seen {
				b.times[p.Name] = time.Now()
			}
			b.mu.Unlock()
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		tCtx.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tCtx)
	tCtx.Cleanup(cancel)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return b
}

// wait waits until n pods are bound and returns when the first and the last
// were seen bound. It gives up when no pod has been bound for a minute.
func (b *bindings) wait(tCtx ktesting.TContext, n int) (first, last time.Time, err error) {
	progress, count := time.Now(), 0
	err = wait.PollUntilContextCancel(tCtx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.times) > count {
			progress, count = time.Now(), len(b.times)
		}
		if time.Since(progress) > time.Minute {
			return false, fmt.Errorf("%d of %d pods bound, none for a minute", count, n)
		}
		return count >= n, nil
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		return first, last, err
	}
	for _, t := range b.times {
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	return first, last, nil
}

// unboundReasons describes a few pods that are not bound.
func unboundReasons(tCtx ktesting.TContext, client kubernetes.Interface, ns string) string {
	pods, err := client.CoreV1().Pods(ns).List(tCtx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" || len(out) == 3 {
			continue
		}
		reason := "no PodScheduled condition"
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled {
				reason = c.Message
			}
		}
		events, _ := client.EventsV1().Events(ns).List(tCtx, metav1.ListOptions{FieldSelector: "regarding.name=" + p.Name})
		var history []string
		if events != nil {
			for _, e := range events.Items {
				history = append(history, e.CreationTimestamp.Format("15:04:05.000")+" "+e.Note)
			}
		}
		out = append(out, fmt.Sprintf("%s (%v): %s; events: %v", p.Name, p.Spec.Containers[0].Resources.Limits, reason, history))
	}
	return strings.Join(out, "; ")
}

// fastClient is a client without client-side rate limiting.
func fastClient(tCtx ktesting.TContext) kubernetes.Interface {
	cfg := *controlPlane.Config
	cfg.QPS, cfg.Burst = 5000, 5000
	c, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		tCtx.Fatal(err)
	}
	return c
}

// parallel runs f(0..n-1) on 16 workers and returns the first error.
func parallel(n int, f func(i int) error) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return firstErr
}

// extensionPoint is a histogram's running sum (seconds) and count.
type extensionPoint struct {
	sum   float64
	count uint64
}

// algorithm names the scheduling algorithm (PreFilter through Score, per
// pod) among the extension points.
const algorithm = "Algorithm"

// batchPrefix marks the counts of opportunistic batching's attempts, by
// result, among the extension points.
const batchPrefix = "batch "

// extensionPointTotals reads kube-scheduler's per-extension-point latency
// histogram for a profile, summed over statuses, and its scheduling algorithm
// latency.
func extensionPointTotals(profile string) map[string]extensionPoint {
	out := map[string]extensionPoint{}
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, f := range families {
		var byProfile bool
		switch f.GetName() {
		case "scheduler_framework_extension_point_duration_seconds":
			byProfile = true
		case "scheduler_scheduling_algorithm_duration_seconds":
			// Not labelled by profile: one side's scheduler runs at a time.
		case "scheduler_batch_attempts_total":
			// Opportunistic batching: how often a pod took the previous
			// cycle's results.
			for _, m := range f.GetMetric() {
				if label(m, "profile") == profile {
					t := out[batchPrefix+label(m, "result")]
					t.count += uint64(m.GetCounter().GetValue())
					out[batchPrefix+label(m, "result")] = t
				}
			}
			continue
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			ep := algorithm
			if byProfile {
				if label(m, "profile") != profile {
					continue
				}
				ep = label(m, "extension_point")
			}
			t := out[ep]
			t.sum += m.GetHistogram().GetSampleSum()
			t.count += m.GetHistogram().GetSampleCount()
			out[ep] = t
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// extensionPointMeans formats the mean latency of each extension point
// between two readings.
func extensionPointMeans(before, after map[string]extensionPoint) string {
	var parts []string
	for ep, a := range after {
		b := before[ep]
		if strings.HasPrefix(ep, batchPrefix) {
			parts = append(parts, fmt.Sprintf("%s %d", ep, a.count-b.count))
			continue
		}
		if a.count > b.count {
			parts = append(parts, fmt.Sprintf("%s %.0fµs", ep, (a.sum-b.sum)/float64(a.count-b.count)*1e6))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(max(len(v), 1))
}
