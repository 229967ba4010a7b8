package resize

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Automatic right-sizing (opt-in per pod, gpuinfo.RightSizeAnnotation):
// each node agent reports on its heartbeat Lease what the opted-in
// containers use (gpuinfo.AgentUseAnnotation); from that report the
// controller creates the resizes that shrink a quiet share to its peak plus
// a margin, or restore a shrunken one to the request when use comes near
// the limit. They then take the path of every resize. A report speaks only
// for pods on the reporting agent's node.

// Right-sizing's rule.
const (
	// marginPercent of the peak, at least minMarginMiB, is kept above the
	// peak when a share shrinks; the new share is rounded up to stepMiB.
	marginPercent = 25
	minMarginMiB  = 256
	stepMiB       = 256
	// minShrinkMiB is the least a shrink must free to be worth a resize.
	minShrinkMiB = 512
	// restorePercent of a shrunken limit in use restores the share.
	restorePercent = 90
	// restoreRetry is how soon a restore that was refused (the room was
	// taken meanwhile) is asked again.
	restoreRetry = 15 * time.Second
	// askedFor is how long a resize created is awaited in the informer
	// before another may be created for the container.
	askedFor = time.Minute
)

// Actions of right-sizing: values of v1alpha1.RightSizeLabel and of the metric's
// label.
const (
	actionShrink  = "shrink"
	actionRestore = "restore"
)

// eventRightSizing is the reason of the Event on the pod for each decision.
const eventRightSizing = "GPUShareRightSizing"

var (
	rightSizeDecisions = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "tessera_gpu_right_size_decisions_total",
		Help:           "Resizes created by automatic right-sizing, by action: shrink (to the peak over the quiet period plus a margin) or restore (to the request).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"action"})
	registerMetrics sync.Once
)

// rightSizing is what the controller keeps for right-sizing.
type rightSizing struct {
	mu sync.Mutex
	// reports are the agents' last use reports, by node.
	reports map[string]string
	// invalid holds nodes whose report was found invalid (logged once
	// until it is valid again).
	invalid map[string]bool
	// asked holds the resizes created, by pod UID and container, until the
	// informer has them.
	asked map[string]asked
	// restored holds when a restore was last asked, by pod UID and
	// container (a refused one is asked again restoreRetry later).
	restored map[string]time.Time
	// queue holds the nodes whose reports are to be read, while leading.
	queue workqueue.TypedInterface[string]
}

type asked struct {
	name string
	at   time.Time
}

// LeaseHandler follows the agents' Leases for their use reports (the
// scheduler's Lease informer in the agents' namespace).
func (c *Controller) LeaseHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.observeLease(obj, false) },
		UpdateFunc: func(_, obj any) { c.observeLease(obj, false) },
		DeleteFunc: func(obj any) { c.observeLease(obj, true) },
	}
}

// observeLease keeps an agent's last use report and queues its node, or
// forgets the report of a Lease deleted.
func (c *Controller) observeLease(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	node, ok := strings.CutPrefix(lease.Name, gpuinfo.AgentLeasePrefix)
	if !ok {
		return
	}
	raw := lease.Annotations[gpuinfo.AgentUseAnnotation]
	c.rs.mu.Lock()
	defer c.rs.mu.Unlock()
	if c.rs.reports == nil {
		c.rs.reports = map[string]string{}
	}
	if deleted || raw == "" {
		delete(c.rs.reports, node)
		return
	}
	c.rs.reports[node] = raw
	if c.rs.queue != nil {
		c.rs.queue.Add(node)
	}
}

// rightSize reads the reports of the nodes queued until ctx ends (the term
// as leader).
func (c *Controller) rightSize(ctx context.Context) {
	queue := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "gpushare-right-size"})
	c.rs.mu.Lock()
	c.rs.queue = queue
	for node := range c.rs.reports {
		queue.Add(node)
	}
	c.rs.mu.Unlock()
	go func() {
		<-ctx.Done()
		c.rs.mu.Lock()
		c.rs.queue = nil
		c.rs.mu.Unlock()
		queue.ShutDown()
	}()
	for {
		node, quit := queue.Get()
		if quit {
			return
		}
		c.readReport(ctx, node)
		queue.Done(node)
	}
}

// readReport decides for every container in the node's report.
func (c *Controller) readReport(ctx context.Context, node string) {
	logger := klog.FromContext(ctx).WithValues("node", node)
	c.rs.mu.Lock()
	raw := c.rs.reports[node]
	c.rs.mu.Unlock()
	if raw == "" {
		return
	}
	report, err := gpuinfo.DecodeUseReport(raw)
	c.rs.mu.Lock()
	if c.rs.invalid == nil {
		c.rs.invalid = map[string]bool{}
	}
	warn := err != nil && !c.rs.invalid[node]
	c.rs.invalid[node] = err != nil
	c.rs.mu.Unlock()
	if err != nil {
		if warn {
			logger.Error(err, "The node agent's use report on its Lease is invalid; its pods are not right-sized until it is valid")
		}
		return
	}
	for _, use := range report.Containers {
		if err := c.rightSizeContainer(ctx, node, use); err != nil {
			logger.Error(err, "Right-sizing", "pod", klog.KRef(use.Namespace, use.Pod), "container", use.Container)
		}
	}
}

// rightSizeContainer creates the resize the container's use calls for, if
// any.
func (c *Controller) rightSizeContainer(ctx context.Context, node string, use gpuinfo.ContainerUse) error {
	pod, err := c.Pod(use.Namespace, use.Pod)
	if err != nil || pod.UID != use.UID || pod.Spec.NodeName != node || pod.DeletionTimestamp != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil // gone, replaced, not yet running — or not the reporting agent's to speak for
	}
	quiet, on, err := gpuinfo.QuietPeriod(pod)
	if err != nil || !on {
		return nil
	}
	_, entries, err := c.containerShares(pod, use.Container)
	if err != nil || slices.ContainsFunc(entries, func(e gpuinfo.CardAssignment) bool { return e.MIG != nil || e.Cores >= gpuinfo.FullCores }) {
		return nil
	}
	_, limits, err := c.requested(pod, use.Container, entries)
	if err != nil {
		return err
	}
	request := slices.Min(limits) // the least, for a request in percent of cards of different sizes
	last := c.lastResize(pod, use.Container)
	if last.open {
		return nil
	}
	var share int64
	for _, e := range entries {
		share = max(share, e.MemoryMiB)
	}
	action, target := decide(share, request, use, quiet)
	if action == "" || !c.due(action, string(pod.UID)+"/"+use.Container, last, quiet) {
		return nil
	}
	return c.askRightSize(ctx, pod, use, action, share, target, quiet)
}

// due reports whether right-sizing may ask for the action now: a shrink
// not within a quiet period of the container's last decided resize, a
// restore not within restoreRetry of the last one asked (key: pod UID and
// container).
func (c *Controller) due(action, key string, last history, quiet time.Duration) bool {
	if action == actionShrink {
		return last.decidedAt.IsZero() || c.now().Sub(last.decidedAt) >= quiet
	}
	return c.restoreDue(key)
}

// restoreDue reports whether a restore may be asked for the container
// (key: pod UID and container): none was in the last restoreRetry.
func (c *Controller) restoreDue(key string) bool {
	c.rs.mu.Lock()
	defer c.rs.mu.Unlock()
	for k, at := range c.rs.restored {
		if c.now().Sub(at) >= restoreRetry {
			delete(c.rs.restored, k)
		}
	}
	_, recent := c.rs.restored[key]
	return !recent
}

// decide is right-sizing's rule for a container holding share MiB per card
// of request: restore to the request when the last reading is within
// restorePercent of a shrunken share; shrink to the peak plus the margin
// once the peak covers the quiet period and the shrink frees at least
// minShrinkMiB. It returns the action ("" for none) and the new share.
func decide(share, request int64, use gpuinfo.ContainerUse, quiet time.Duration) (string, int64) {
	if share < request && use.UseMiB*100 >= share*restorePercent {
		return actionRestore, request
	}
	if use.Window() < quiet {
		return "", 0
	}
	target := use.PeakMiB + max(use.PeakMiB*marginPercent/100, minMarginMiB)
	target = min((target+stepMiB-1)/stepMiB*stepMiB, request)
	if share-target < minShrinkMiB {
		return "", 0
	}
	return actionShrink, target
}

// history is what the resizes of a container say for right-sizing.
type history struct {
	// open: a resize is not decided yet (or just created).
	open bool
	// decidedAt is when the newest decided one was decided.
	decidedAt time.Time
}

// lastResize reads the container's resizes since the pod was created.
func (c *Controller) lastResize(pod *v1.Pod, container string) history {
	key := string(pod.UID) + "/" + container
	c.rs.mu.Lock()
	a, ok := c.rs.asked[key]
	c.rs.mu.Unlock()
	var h history
	seen := false
	for _, r := range c.resizesOf(pod.Namespace, pod.Name) {
		if r.Spec.Container != container || r.CreationTimestamp.Before(&pod.CreationTimestamp) {
			continue
		}
		seen = seen || (ok && r.Name == a.name)
		if !r.Decided() {
			h.open = true
			continue
		}
		for _, kind := range []string{v1alpha1.ConditionApplied, v1alpha1.ConditionRefused} {
			if cond := meta.FindStatusCondition(r.Status.Conditions, kind); cond != nil && cond.Status == metav1.ConditionTrue && cond.LastTransitionTime.After(h.decidedAt) {
				h.decidedAt = cond.LastTransitionTime.Time
			}
		}
	}
	if ok && (seen || c.now().Sub(a.at) > askedFor) {
		c.rs.mu.Lock()
		delete(c.rs.asked, key)
		c.rs.mu.Unlock()
	} else if ok {
		h.open = true
	}
	return h
}

// resizesOf lists the resizes of a pod from the informer.
func (c *Controller) resizesOf(namespace, pod string) []*v1alpha1.GPUShareResize {
	objs, err := c.informer.GetIndexer().ByIndex(podIndex, namespace+"/"+pod)
	if err != nil {
		return nil
	}
	out := make([]*v1alpha1.GPUShareResize, 0, len(objs))
	for _, obj := range objs {
		r := &v1alpha1.GPUShareResize{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// podIndex indexes resizes by the namespace and name of their pod.
const podIndex = "pod"

func indexByPod(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	pod, _, _ := unstructured.NestedString(u.Object, "spec", "podName")
	return []string{u.GetNamespace() + "/" + pod}, nil
}

// askRightSize creates the resize, owned by the pod (it goes with it), and
// tells the pod's owner why.
func (c *Controller) askRightSize(ctx context.Context, pod *v1.Pod, use gpuinfo.ContainerUse, action string, share, target int64, quiet time.Duration) error {
	memory := resource.NewQuantity(target<<20, resource.BinarySI)
	r := &v1alpha1.GPUShareResize{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    truncate(pod.Name, 200) + "-right-size-",
			Namespace:       pod.Namespace,
			Labels:          map[string]string{v1alpha1.RightSizeLabel: action},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Spec: v1alpha1.GPUShareResizeSpec{PodName: pod.Name, Container: use.Container, Memory: memory},
	}
	u, err := r.Unstructured()
	if err != nil {
		return err
	}
	created, err := c.resizes.Namespace(pod.Namespace).Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("creating a resize: %w", err)
	}
	c.rs.mu.Lock()
	if c.rs.asked == nil {
		c.rs.asked = map[string]asked{}
	}
	c.rs.asked[string(pod.UID)+"/"+use.Container] = asked{name: created.GetName(), at: c.now()}
	if action == actionRestore {
		if c.rs.restored == nil {
			c.rs.restored = map[string]time.Time{}
		}
		c.rs.restored[string(pod.UID)+"/"+use.Container] = c.now()
	}
	c.rs.mu.Unlock()
	rightSizeDecisions.WithLabelValues(action).Inc()
	message := fmt.Sprintf("shrinking container %q from %d to %d MiB per card (%s): it used at most %d MiB over the last %v, its quiet period",
		use.Container, share, target, created.GetName(), use.PeakMiB, use.Window())
	if action == actionRestore {
		message = fmt.Sprintf("restoring container %q from %d MiB per card to its request, %d MiB (%s): it uses %d MiB, at least %d%% of the share",
			use.Container, share, target, created.GetName(), use.UseMiB, restorePercent)
	}
	klog.FromContext(ctx).Info("Right-sizing a GPU share", "pod", klog.KObj(pod), "action", action, "message", message, "quietPeriod", quiet)
	c.event(pod, v1.EventTypeNormal, eventRightSizing, "%s", message)
	c.pruneRightSizes(ctx, pod, use.Container)
	return nil
}

// keptRightSizes is how many decided resizes of right-sizing are kept per
// container; older ones are deleted (the pod's history stays in Events).
const keptRightSizes = 4

// pruneRightSizes deletes the container's decided right-sizing resizes
// beyond the newest keptRightSizes.
func (c *Controller) pruneRightSizes(ctx context.Context, pod *v1.Pod, container string) {
	var decided []*v1alpha1.GPUShareResize
	for _, r := range c.resizesOf(pod.Namespace, pod.Name) {
		if r.Spec.Container == container && r.Labels[v1alpha1.RightSizeLabel] != "" && r.Decided() {
			decided = append(decided, r)
		}
	}
	if len(decided) <= keptRightSizes {
		return
	}
	slices.SortFunc(decided, func(a, b *v1alpha1.GPUShareResize) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	for _, r := range decided[keptRightSizes:] {
		uid := r.UID
		if err := c.resizes.Namespace(r.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
			klog.FromContext(ctx).V(2).Info("Old right-sizing resize not deleted", "resize", klog.KObj(r), "err", err)
		}
	}
}

// truncate cuts s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
