package sim

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// DeparturePadding is how far a departures replay's arrivals extend by
// default: tasks are resampled until their GPU request is this many times
// the capacity. More arrivals make a longer window.
const DeparturePadding = 2

// DepartureSamples is how many equal steps of the arrival window a
// departures replay samples allocation, offered load and pending pods at
// (DepartureSamples+1 samples, both ends included).
const DepartureSamples = 100

// DeparturesConfig is a replay in which tasks also leave.
type DeparturesConfig struct {
	// Nodes, Tasks, Seed and Profile are as in Config; every task needs a
	// duration (trace.Task.HasDuration).
	Nodes   []trace.Node
	Tasks   []trace.Task
	Seed    uint64
	Profile string
	// Load is the offered GPU load as a fraction of capacity (ArrivalTimes).
	Load float64
	// Fleet is the fraction of the GPU nodes replayed on (ScaledFleet), in
	// (0, 1]; 0 is the whole fleet. The arrivals scale with it.
	Fleet float64
	// Arrivals is the GPU the arrivals ask, in multiples of the replayed
	// fleet's capacity; 0 is DeparturePadding.
	Arrivals float64
	// Progress, when set, is called after each arrival with the number
	// arrived and the total.
	Progress func(done, total int)
}

// DeparturesResult is a departures replay's outcome. Times are the replay's
// virtual time, from the trace's durations.
type DeparturesResult struct {
	Profile string
	Seed    uint64
	Load    float64
	// Fleet is the fraction of the fleet replayed on, TotalGPUs its cards;
	// Arrivals the GPU the arrivals asked, in multiples of the capacity.
	Fleet, Arrivals float64
	TotalGPUs       int
	// Window is the time from the start to the last arrival, where the
	// replay ends.
	Window time.Duration
	// Allocation is the GPU held by running tasks and Offered the GPU asked
	// by tasks arrived and not finished (running or waiting), both in
	// percent of capacity, and Pending the pods waiting, at each of
	// DepartureSamples+1 equal steps of the window.
	Allocation, Offered []float64
	Pending             []int
	// Waits is how long each placed task arrived after the start waited
	// for its node, in arrival order; MultiCardWaits those of tasks asking
	// two cards or more.
	Waits, MultiCardWaits []time.Duration
	// Tasks arrived, the first Initial of them at the start
	// (StationaryStart); Placed got a node; Departed ran their duration
	// and left; StillPending were waiting when the window ended.
	Tasks, Initial, Placed, Departed, StillPending int
	// PendingForFullModel is how many of the StillPending waited for
	// capacity rather than for a better placement: the GPU left free on all
	// the nodes that could ever hold the pod (its models, enough cards and
	// CPU) was less than it asks.
	PendingForFullModel int
	Elapsed             time.Duration
}

// ScaledFleet keeps a fraction of the nodes with the fleet's mix: the nodes
// sorted by GPU model, card count, CPU and memory, one kept wherever the
// running count of fraction × nodes passes a whole number, and at least one
// of every model. A departures
// replay's cost grows with the square of the fleet (more nodes per
// scheduling cycle, more arrivals to fill them); a smaller fleet with the
// same mix and the same offered load gives what an operator of a smaller
// cluster would see.
func ScaledFleet(nodes []trace.Node, fraction float64) ([]trace.Node, error) {
	if !(fraction > 0 && fraction <= 1) {
		return nil, fmt.Errorf("fleet fraction %v: want a fraction in (0, 1]", fraction)
	}
	if fraction == 1 {
		return nodes, nil
	}
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b trace.Node) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), cmp.Compare(a.GPUs, b.GPUs),
			cmp.Compare(a.CPUMilli, b.CPUMilli), cmp.Compare(a.MemoryMiB, b.MemoryMiB), strings.Compare(a.Name, b.Name))
	})
	keep := make([]bool, len(sorted))
	models := map[string]bool{}
	for i, n := range sorted {
		if math.Floor(float64(i+1)*fraction) > math.Floor(float64(i)*fraction) {
			keep[i], models[n.Model] = true, true
		}
	}
	// A model the sampling passed over keeps its middle node: tasks that
	// ask for it would otherwise have nowhere to go.
	for first := 0; first < len(sorted); {
		end := first
		for end < len(sorted) && sorted[end].Model == sorted[first].Model {
			end++
		}
		if !models[sorted[first].Model] {
			keep[(first+end-1)/2] = true
		}
		first = end
	}
	var kept []trace.Node
	for i, n := range sorted {
		if keep[i] {
			kept = append(kept, n)
		}
	}
	return kept, nil
}

// departureArrivals is the arrival sequence of a departures replay: the
// tasks shuffled and padded (padded) to padding times the capacity, and cut
// there when the task list alone asks more (as it does of a scaled fleet).
func departureArrivals(tasks []trace.Task, capacityMilli int64, seed uint64, padding float64) []trace.Task {
	arrivals := padded(tasks, capacityMilli, seed, padding)
	target := int64(float64(capacityMilli) * padding)
	var total int64
	for i, t := range arrivals {
		if total >= target {
			return arrivals[:i]
		}
		total += t.GPUMilliTotal()
	}
	return arrivals
}

// ArrivalTimes spaces n arrivals as a Poisson process of the seed at the
// rate that holds the offered GPU load at load times the capacity in a
// steady state (Little's law): load × capacity over the mean, across the
// task list, of a task's GPU times its duration. The offered load at a
// moment is the GPU asked by the tasks arrived and not yet past their
// duration: what the cluster would hold if every task started on arrival.
// With StationaryStart's tasks present at the start it stays at that level
// over the whole window.
func ArrivalTimes(tasks []trace.Task, n int, capacityMilli int64, load float64, seed uint64) ([]time.Duration, error) {
	gpuSeconds := meanGPUSeconds(tasks)
	if n <= 0 || capacityMilli <= 0 || !(load > 0) || !(gpuSeconds > 0) {
		return nil, fmt.Errorf("arrival times: need arrivals, capacity, a load above 0 and tasks that hold GPU for some time (%d arrivals, load %v)", n, load)
	}
	rate := load * float64(capacityMilli) / gpuSeconds
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	times := make([]time.Duration, n)
	var at float64
	for i := range times {
		at += rng.ExpFloat64() / rate
		times[i] = time.Duration(at * float64(time.Second))
	}
	return times, nil
}

// meanGPUSeconds is the mean over the tasks of GPU (milli) times duration
// (seconds).
func meanGPUSeconds(tasks []trace.Task) float64 {
	var sum float64
	for _, t := range tasks {
		sum += float64(t.GPUMilliTotal()) * t.Duration.Seconds()
	}
	return sum / float64(max(len(tasks), 1))
}

// StationaryStart is what a cluster in the steady state of ArrivalTimes'
// arrivals holds at a random moment, drawn with the seed: with tasks
// arriving uniformly from the list, a task is present in proportion to its
// duration, and what remains of its run is uniform over that duration. Tasks
// are drawn until their GPU reaches load times the capacity; each comes with
// its remaining duration and a numbered name. Without it a replay would
// start from an empty cluster and, tasks' durations being heavy-tailed (in
// the openb lists, tasks of a day or more hold nine tenths of the GPU time),
// fill for the whole window instead of holding the offered load.
func StationaryStart(tasks []trace.Task, capacityMilli int64, load float64, seed uint64) []trace.Task {
	cumulative := make([]float64, len(tasks))
	var total float64
	for i, t := range tasks {
		total += t.Duration.Seconds()
		cumulative[i] = total
	}
	if !(total > 0) || !(meanGPUSeconds(tasks) > 0) {
		// Nothing holds GPU for any time: the steady state holds none.
		return nil
	}
	rng := rand.New(rand.NewPCG(seed^0x57a7, seed))
	target := int64(load * float64(capacityMilli))
	var out []trace.Task
	for held := int64(0); held < target; {
		i, _ := slices.BinarySearch(cumulative, rng.Float64()*total)
		t := tasks[min(i, len(tasks)-1)]
		t.Name = fmt.Sprintf("%s-s%d", t.Name, len(out))
		t.Duration = time.Duration(rng.Float64() * float64(t.Duration))
		out = append(out, t)
		held += t.GPUMilliTotal()
	}
	return out
}

// live is one arrived task of a departures replay.
type live struct {
	index   int
	task    trace.Task
	pod     *v1.Pod
	arrived time.Duration
}

// departure is when a running task leaves; seq orders departures at the
// same moment.
type departure struct {
	at   time.Duration
	seq  int
	name string
}

type departureHeap []departure

func (h departureHeap) Len() int { return len(h) }
func (h departureHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].seq < h[j].seq)
}
func (h departureHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *departureHeap) Push(x any)   { *h = append(*h, x.(departure)) }
func (h *departureHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// virtualClock is the scheduling queue's clock in a departures replay: the
// replay's virtual time, moved by the replay. Each reading is later than
// the one before, so that pods the queue stamps at one virtual moment keep
// the order in which they were stamped (kube-scheduler orders pods of equal
// priority by that stamp), and a replay is reproducible.
type virtualClock struct {
	*testingclock.FakeClock
	mu   sync.Mutex
	last time.Time
}

func newVirtualClock(start time.Time) *virtualClock {
	return &virtualClock{FakeClock: testingclock.NewFakeClock(start), last: start}
}

// Now returns the virtual time, a nanosecond past the last reading if it
// has not moved since.
func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.FakeClock.Now()
	if !now.After(c.last) {
		now = c.last.Add(time.Nanosecond)
	}
	c.last = now
	return now
}

// Since is the time from t to Now.
func (c *virtualClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// neverFlushed keeps unschedulable pods waiting for an event that may help
// them, instead of kube-scheduler's five minutes, and backoff is off: on a
// virtual clock the flushes would happen at moments set by the wall clock.
const neverFlushed = 100 * 365 * 24 * time.Hour

// departuresReplay is the state of one departures replay.
type departuresReplay struct {
	ctx        context.Context
	client     *fake.Clientset
	sched      *scheduler.Scheduler
	queue      *pacedQueue
	gpuShare   *orderedGPUShare
	watcher    watch.Interface
	clock      *virtualClock
	start      time.Time
	capacity   int64
	pending    map[string]*live
	running    map[string]*live
	departures departureHeap
	seq        int
	// waits is each arrival's wait for its node, -1 while it has none.
	waits []time.Duration
	// bound are the pods bound since the last settle, in the order the
	// watch gave them.
	bound []*live
	res   *DeparturesResult
	// heldMilli and askedMilli are the GPU of running tasks, and of running
	// and waiting ones.
	heldMilli, askedMilli int64
	nextSample            int
}

// RunDepartures replays the trace with departures: the cluster starts with
// the tasks of a steady state at the offered load (StationaryStart), tasks
// arrive at ArrivalTimes, wait until the scheduler places them, run for
// their trace duration and leave. The replay ends at the last arrival. Unlike Run it
// reports what an operator watches: allocation over time against the load
// offered, and how long pods waited.
func RunDepartures(ctx context.Context, cfg DeparturesConfig) (*DeparturesResult, error) {
	begin := time.Now()
	for _, t := range cfg.Tasks {
		if !t.HasDuration {
			return nil, fmt.Errorf("task %s has no duration: a departures replay needs task lists with creation_time and deletion_time", t.Name)
		}
	}
	fleet := cmp.Or(cfg.Fleet, 1)
	nodes, err := ScaledFleet(GPUNodes(cfg.Nodes), fleet)
	if err != nil {
		return nil, err
	}
	capacity := CapacityMilli(nodes)
	if capacity == 0 {
		return nil, fmt.Errorf("the trace has no GPU nodes")
	}
	padding := cmp.Or(cfg.Arrivals, DeparturePadding)
	if !(padding > 0) {
		return nil, fmt.Errorf("arrivals of %v times the capacity: want more than 0", padding)
	}
	stream := departureArrivals(cfg.Tasks, capacity, cfg.Seed, padding)
	streamTimes, err := ArrivalTimes(cfg.Tasks, len(stream), capacity, cfg.Load, cfg.Seed)
	if err != nil {
		return nil, err
	}
	initial := StationaryStart(cfg.Tasks, capacity, cfg.Load, cfg.Seed)
	arrivals := append(initial, stream...)
	times := append(make([]time.Duration, len(initial)), streamTimes...)
	schedCfg, err := LoadProfile(cfg.Profile)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &departuresReplay{
		ctx: ctx, client: fake.NewSimpleClientset(), start: time.Unix(0, 0), capacity: capacity,
		pending: map[string]*live{}, running: map[string]*live{},
		res: &DeparturesResult{Profile: cfg.Profile, Seed: cfg.Seed, Load: cfg.Load, Fleet: fleet, Arrivals: padding, TotalGPUs: int(capacity / 1000),
			Window: times[len(times)-1], Initial: len(initial)},
	}
	r.clock = newVirtualClock(r.start)
	r.waits = make([]time.Duration, len(arrivals))
	for i := range r.waits {
		r.waits[i] = -1
	}
	r.client.PrependReactor("create", "pods", bindReactor(r.client.Tracker()))
	informers := scheduler.NewInformerFactory(r.client, 0, nil)
	recorders := profile.RecorderFactory(func(string) events.EventRecorderLogger { return &events.FakeRecorder{} })
	r.sched, err = scheduler.New(ctx, r.client, informers, nil, recorders,
		scheduler.WithProfiles(schedCfg.Profiles...),
		scheduler.WithPercentageOfNodesToScore(ptr.To[int32](100)),
		scheduler.WithParallelism(1),
		scheduler.WithClock(r.clock),
		scheduler.WithPodMaxInUnschedulablePodsDuration(neverFlushed),
		scheduler.WithPodMaxBackoffSeconds(0),
		scheduler.WithFrameworkOutOfTreeRegistry(r.registry()),
	)
	if err != nil {
		return nil, fmt.Errorf("building the scheduler: %w", err)
	}
	canHold := holdable(nodes, gpuinfo.DefaultResourceNames())
	r.queue = pace(ctx, r.sched, canHold)
	informers.Start(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())
	go r.sched.Run(ctx)
	if err := addNodes(ctx, r.client, r.sched, nodes); err != nil {
		return nil, err
	}
	if r.watcher, err = r.client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{}); err != nil {
		return nil, err
	}
	defer r.watcher.Stop()

	for i, t := range arrivals {
		for len(r.departures) > 0 && r.departures[0].at <= times[i] {
			d := heap.Pop(&r.departures).(departure)
			if err := r.depart(d); err != nil {
				return nil, err
			}
		}
		if err := r.arrive(t, i, times[i], cfg.Profile); err != nil {
			return nil, err
		}
		if cfg.Progress != nil {
			cfg.Progress(i+1, len(arrivals))
		}
	}
	r.sample(r.res.Window)
	for i, w := range r.waits {
		if w < 0 || i < len(initial) {
			continue
		}
		r.res.Waits = append(r.res.Waits, w)
		if arrivals[i].NumGPU > 1 {
			r.res.MultiCardWaits = append(r.res.MultiCardWaits, w)
		}
	}
	r.res.Tasks, r.res.StillPending = len(arrivals), len(r.pending)
	r.res.PendingForFullModel = r.pendingForFullModel(nodes, canHold)
	r.res.Elapsed = time.Since(begin)
	return r.res, nil
}

// registry is the replay's plugins, keeping the GPUShare instance the
// scheduler builds (during scheduler.New: the one profile's).
func (r *departuresReplay) registry() frameworkruntime.Registry {
	reg := frameworkruntime.Registry{}
	for name, factory := range registry {
		reg[name] = factory
	}
	reg[gpushare.Name] = func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		p, err := newOrderedGPUShare(ctx, obj, h)
		if err == nil {
			r.gpuShare = p.(*orderedGPUShare)
		}
		return p, err
	}
	return reg
}

// advance samples the state up to at and moves the clock there.
func (r *departuresReplay) advance(at time.Duration) {
	r.sample(at)
	r.clock.SetTime(r.start.Add(at))
}

// sample records the state at every sample point up to at (inclusive when
// at is the window's end).
func (r *departuresReplay) sample(at time.Duration) {
	window := r.res.Window
	for r.nextSample <= DepartureSamples {
		point := time.Duration(float64(window) * float64(r.nextSample) / DepartureSamples)
		if point > at || (point == at && at < window) {
			return
		}
		r.res.Allocation = append(r.res.Allocation, float64(r.heldMilli)*100/float64(r.capacity))
		r.res.Offered = append(r.res.Offered, float64(r.askedMilli)*100/float64(r.capacity))
		r.res.Pending = append(r.res.Pending, len(r.pending))
		r.nextSample++
	}
}

// arrive creates task i's pod at its arrival time and waits for the
// scheduler to settle.
func (r *departuresReplay) arrive(t trace.Task, i int, at time.Duration, profileName string) error {
	r.advance(at)
	p := pod(t, i, profileName)
	if _, err := r.client.CoreV1().Pods(namespace).Create(r.ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	r.pending[p.Name] = &live{index: i, task: t, pod: p, arrived: at}
	r.askedMilli += t.GPUMilliTotal()
	return r.settle(at)
}

// depart deletes a running task's pod when its duration has run out and
// waits for the scheduler to settle: pods waiting for room may take it.
func (r *departuresReplay) depart(d departure) error {
	r.advance(d.at)
	l := r.running[d.name]
	delete(r.running, d.name)
	r.heldMilli -= l.task.GPUMilliTotal()
	r.askedMilli -= l.task.GPUMilliTotal()
	r.res.Departed++
	if err := r.client.CoreV1().Pods(namespace).Delete(r.ctx, d.name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	// The scheduler's delete handler drops the pod from its cache and then
	// moves the pods the departure may help; GPUShare's ledger drops it on
	// a handler of its own. Settling starts once both have.
	gone := func() bool {
		return r.queue.deletions.Load() == int64(r.res.Departed) && !r.gpuShare.HoldsCards(l.pod.UID)
	}
	if err := r.waitFor(gone); err != nil {
		return fmt.Errorf("waiting for the scheduler to see pod %s leave: %w", d.name, err)
	}
	return r.settle(d.at)
}

// settle waits until the scheduler has done what it can at virtual time
// now: every waiting pod is back among the unschedulable ones, none is
// queued, in flight or binding, and the cache holds exactly the running
// pods. Pods bound meanwhile start running now, taken in arrival order:
// bindings run concurrently and reach the watch in any order.
func (r *departuresReplay) settle(now time.Duration) error {
	queue := r.sched.SchedulingQueue
	err := r.waitFor(func() bool {
		return len(queue.InFlightPods()) == 0 && len(queue.PodsInActiveQ()) == 0 && len(queue.PodsInBackoffQ()) == 0 &&
			r.cachedPods() == len(r.running) && len(queue.UnschedulablePods()) == len(r.pending)
	})
	if err != nil {
		return fmt.Errorf("waiting for the scheduler to settle at %s (%d pods waiting, %d running): %w", now, len(r.pending), len(r.running), err)
	}
	slices.SortFunc(r.bound, func(a, b *live) int { return a.index - b.index })
	for _, l := range r.bound {
		r.waits[l.index] = now - l.arrived
		r.seq++
		heap.Push(&r.departures, departure{at: now + l.task.Duration, seq: r.seq, name: l.pod.Name})
	}
	r.bound = r.bound[:0]
	// The fake clientset keeps every action it served; the replay reads
	// none of them.
	r.client.ClearActions()
	return nil
}

// pendingForFullModel counts the waiting pods for which the nodes that
// could ever hold them (canHold) have, all together, less free GPU than
// they ask: they wait for their model's cards to be given back, which no
// placement could have spared them.
func (r *departuresReplay) pendingForFullModel(nodes []trace.Node, canHold func(*v1.Pod, string) bool) int {
	freeMilli := make(map[string]int64, len(nodes))
	for _, n := range nodes {
		freeMilli[n.Name] = int64(n.GPUs) * 1000
	}
	for _, l := range r.running {
		freeMilli[l.pod.Spec.NodeName] -= l.task.GPUMilliTotal()
	}
	count := 0
	for _, l := range r.pending {
		var free int64
		for _, n := range nodes {
			if canHold(l.pod, n.Name) {
				free += freeMilli[n.Name]
			}
		}
		if free < l.task.GPUMilliTotal() {
			count++
		}
	}
	return count
}

// collectBindings takes the pods bound since the last look off the watch,
// moves them from pending to running and adds them to r.bound.
func (r *departuresReplay) collectBindings() {
	for {
		select {
		case ev, ok := <-r.watcher.ResultChan():
			if !ok {
				return
			}
			p, isPod := ev.Object.(*v1.Pod)
			if !isPod || p.Spec.NodeName == "" || ev.Type == watch.Deleted {
				continue
			}
			l := r.pending[p.Name]
			if l == nil {
				continue
			}
			delete(r.pending, p.Name)
			l.pod = p
			r.running[p.Name] = l
			r.heldMilli += l.task.GPUMilliTotal()
			r.res.Placed++
			r.bound = append(r.bound, l)
		default:
			return
		}
	}
}

// cachedPods is how many pods the scheduler's cache holds (bound or
// assumed).
func (r *departuresReplay) cachedPods() int {
	n, err := r.sched.Cache.PodCount()
	if err != nil {
		return -1
	}
	return n
}

// waitFor polls cond until it holds, for at most taskTimeout, taking the
// bindings off the watch meanwhile: failed attempts patch pods' status, and
// a watch left undrained overflows (the fake clientset's holds 100 events).
func (r *departuresReplay) waitFor(cond func() bool) error {
	deadline := time.Now().Add(taskTimeout)
	for r.collectBindings(); !cond(); r.collectBindings() {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", taskTimeout)
		}
		time.Sleep(50 * time.Microsecond)
	}
	return nil
}
