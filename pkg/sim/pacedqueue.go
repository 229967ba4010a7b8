package sim

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler"
	internalqueue "k8s.io/kubernetes/pkg/scheduler/backend/queue"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// pacedQueue is the scheduling queue of a departures replay, made
// reproducible. kube-scheduler's queue moves the pods an event may help
// one at a time and wakes the scheduling loop after the last, but a loop
// that was not asleep yet pops the first pod moved rather than the first in
// the queue's order, and which pod is moved first depends on map order.
// pacedQueue makes moving and popping exclusive: the loop pops only when a
// pod is queued, and never while a move is under way. It also counts the
// moves made for deleted assigned pods, which a departure waits for, and
// moves for such a deletion only the pods its node could ever hold
// (holdable): kube-scheduler's NodeResourcesFit moves every pod after any
// deletion, which on a long queue of pods waiting for another model or a
// larger node makes each departure cost a scheduling cycle per waiting pod.
//
// Pods reach the active queue only through the methods wrapped here:
// departures replays turn off backoff and the periodic flush of
// unschedulable pods.
type pacedQueue struct {
	internalqueue.SchedulingQueue
	pop       func(klog.Logger) (framework.QueuedEntityInfo, error)
	mu        sync.Mutex
	queued    *sync.Cond
	closed    bool
	deletions atomic.Int64
	// holdable reports whether the named node could ever hold the pod.
	holdable func(pod *v1.Pod, node string) bool
}

// pace puts a pacedQueue between the scheduler and its queue. It must be
// called before the scheduler's informers start or its loop runs.
func pace(ctx context.Context, sched *scheduler.Scheduler, holdable func(pod *v1.Pod, node string) bool) *pacedQueue {
	q := &pacedQueue{SchedulingQueue: sched.SchedulingQueue, pop: sched.NextEntity, holdable: holdable}
	q.queued = sync.NewCond(&q.mu)
	sched.SchedulingQueue, sched.NextEntity = q, q.next
	go func() {
		<-ctx.Done()
		q.wake(func() { q.closed = true })
	}()
	return q
}

// next is the scheduling loop's pop: it waits, outside the queue, until a
// pod is active, then pops it with no move under way.
func (q *pacedQueue) next(logger klog.Logger) (framework.QueuedEntityInfo, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.closed && len(q.PodsInActiveQ()) == 0 {
		q.queued.Wait()
	}
	return q.pop(logger)
}

// wake runs change with popping held off, then wakes the loop.
func (q *pacedQueue) wake(change func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	change()
	q.queued.Broadcast()
}

// Add queues a new pod.
func (q *pacedQueue) Add(ctx context.Context, pod *v1.Pod) {
	q.wake(func() { q.SchedulingQueue.Add(ctx, pod) })
}

// Update updates a queued pod, which may make it active.
func (q *pacedQueue) Update(ctx context.Context, oldPod, newPod *v1.Pod) {
	q.wake(func() { q.SchedulingQueue.Update(ctx, oldPod, newPod) })
}

// Activate makes the given pods active.
func (q *pacedQueue) Activate(logger klog.Logger, pods map[string]*v1.Pod) {
	q.wake(func() { q.SchedulingQueue.Activate(logger, pods) })
}

// AddUnschedulablePodIfNotPresent returns a pod after a failed attempt; events
// seen during the attempt may make it active again.
func (q *pacedQueue) AddUnschedulablePodIfNotPresent(logger klog.Logger, pInfo *framework.QueuedPodInfo, cycle int64) error {
	var err error
	q.wake(func() { err = q.SchedulingQueue.AddUnschedulablePodIfNotPresent(logger, pInfo, cycle) })
	return err
}

// MoveAllToActiveOrBackoffQueue moves the pods the event may help, as one
// step (for an assigned pod's deletion, only those its node could hold),
// and counts assigned-pod deletions.
func (q *pacedQueue) MoveAllToActiveOrBackoffQueue(logger klog.Logger, event fwk.ClusterEvent, oldObj, newObj any, preCheck internalqueue.PreEnqueueCheck) {
	if deleted, ok := oldObj.(*v1.Pod); ok && preCheck == nil && q.holdable != nil && deleted.Spec.NodeName != "" &&
		event.Label() == framework.EventAssignedPodDelete.Label() {
		preCheck = func(p *v1.Pod) bool { return q.holdable(p, deleted.Spec.NodeName) }
	}
	q.wake(func() { q.SchedulingQueue.MoveAllToActiveOrBackoffQueue(logger, event, oldObj, newObj, preCheck) })
	if event.Label() == framework.EventAssignedPodDelete.Label() {
		q.deletions.Add(1)
	}
}

// holdable reports whether a node could ever hold a pod, whatever runs on
// it: CPU within its capacity, and for a GPU pod enough cards of a model
// the pod accepts. A replay's nodes never change, so a departure from a
// node that could never hold a waiting pod cannot help it.
func holdable(nodes []trace.Node, names gpuinfo.ResourceNames) func(*v1.Pod, string) bool {
	byName := make(map[string]trace.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	return func(pod *v1.Pod, node string) bool {
		n, ok := byName[node]
		if !ok {
			return true
		}
		cpu := pod.Spec.Containers[0].Resources.Requests[v1.ResourceCPU]
		if cpu.MilliValue() > n.CPUMilli {
			return false
		}
		req, err := gpuinfo.ParsePodRequest(pod, names)
		if err != nil || req == nil {
			return err == nil
		}
		model := strings.ToLower(n.Model)
		for _, c := range req.Containers {
			if c.Count > n.GPUs || !req.Selector.Matches(model, "") {
				return false
			}
		}
		return true
	}
}
