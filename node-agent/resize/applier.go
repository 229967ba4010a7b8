// Package resize applies GPUShareResizes on the node: it writes a resized
// share's limits into the container's shared region (node-agent/region),
// checks a shrink against what the container's processes use, and reports
// the LimitsWritten condition the resize controller waits for
// (docs/resize.md).
package resize

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/node-agent/region"
	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Reasons of the LimitsWritten condition.
const (
	ReasonWritten              = "Written"
	ReasonContainerNotRunning  = "ContainerNotRunning"
	ReasonRegionNotInitialised = "RegionNotInitialised"
	ReasonRegionVersion        = "RegionVersionUnsupported"
	ReasonRegionUnwritable     = "RegionUnwritable"
	ReasonUseUnknown           = "UseUnknown"
	ReasonInUse                = "InUse"
)

// DefaultReconcileInterval is how often the agent brings shares back to
// the pods' assignments.
const DefaultReconcileInterval = 30 * time.Second

// regionLockTimeout bounds the wait for the region's lock, which a process
// of the container can hold.
const regionLockTimeout = 5 * time.Second

// Applier applies the resizes of the containers on one node.
type Applier struct {
	// Node is the node's name.
	Node string
	// Client reaches the API server as the node's agent.
	Client dynamic.Interface
	// RegionDir is the host directory of the shared regions
	// (enforce.Paths.HostCacheDir).
	RegionDir string
	// Running lists the containers the runtime runs, with their shares
	// (the NRI plugin's view).
	Running func() []nri.Running
	// Resized records a container's new shares in that view, for admission
	// and over-use detection.
	Resized func(id string, cards []gpuinfo.CardAssignment) bool
	// Use reads what a container's processes use per card UUID, in MiB
	// (NVML, from outside the container).
	Use func(id string) (map[string]int64, error)
	// Pod returns a pod bound to the node (the agent's pod cache).
	Pod func(ctx context.Context, namespace, name string) (*v1.Pod, error)
	// ReconcileInterval is how often every shared container's view and
	// region limits are brought back to its pod's assignment; 0 never.
	ReconcileInterval time.Duration
}

// reconcileKey queues a reconciliation among the resizes' keys (no
// object's key starts with a NUL).
const reconcileKey = "\x00reconcile"

// Run applies resizes until ctx ends.
func (a *Applier) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("resize")
	informer := dynamicinformer.NewDynamicSharedInformerFactory(a.Client, 0).ForResource(v1alpha1.Resource).Informer()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpushareresize-agent"})
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }}); err != nil {
		logger.Error(err, "Watching GPUShareResizes; resizes are not applied on this node")
		return
	}
	go informer.RunWithContext(ctx)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return
	}
	if a.ReconcileInterval > 0 {
		queue.Add(reconcileKey)
	}
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		if key == reconcileKey {
			// In the same goroutine as apply: the two never write one region
			// at once.
			a.reconcile(klog.NewContext(ctx, logger), informer.GetStore())
			queue.Done(key)
			queue.AddAfter(reconcileKey, a.ReconcileInterval)
			continue
		}
		obj, exists, err := informer.GetStore().GetByKey(key)
		if err == nil && exists {
			err = a.apply(klog.NewContext(ctx, logger), obj.(*unstructured.Unstructured))
		}
		if err != nil {
			logger.Error(err, "Resize not applied; retrying", "resize", key)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// apply writes the limits of a resize that waits for this node's agent and
// reports them, once per generation.
func (a *Applier) apply(ctx context.Context, u *unstructured.Unstructured) error {
	r := &v1alpha1.GPUShareResize{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err != nil {
		return nil // the controller refuses what it cannot read
	}
	if r.Status.NodeName != a.Node || r.Decided() || !r.WaitsForNodeAgent() {
		return nil
	}
	if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionLimitsWritten); c != nil && c.ObservedGeneration == r.Generation {
		return nil
	}
	reason, message := a.write(ctx, r)
	status := metav1.ConditionFalse
	if reason == ReasonWritten {
		status = metav1.ConditionTrue
	}
	klog.FromContext(ctx).Info("GPU share resize", "resize", klog.KObj(r), "written", string(status), "reason", reason, "message", message)
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionLimitsWritten, Status: status, Reason: reason, Message: message, ObservedGeneration: r.Generation,
	})
	out, err := r.Unstructured()
	if err != nil {
		return err
	}
	_, err = a.Client.Resource(v1alpha1.Resource).Namespace(r.Namespace).UpdateStatus(ctx, out, metav1.UpdateOptions{FieldManager: "tessera-node-agent"})
	return err
}

// write writes the resize's limits into the container's region and returns
// the condition's reason and message. A shrink whose container uses more
// than it leaves is undone.
func (a *Applier) write(ctx context.Context, r *v1alpha1.GPUShareResize) (string, string) {
	ctr, cards, ok := a.container(ctx, r)
	if !ok {
		return ReasonContainerNotRunning, fmt.Sprintf("container %q of pod %s holds no share on node %s now", r.Spec.Container, r.Spec.PodName, a.Node)
	}
	to, from, resized := limits(cards, r.Status.To), limits(cards, r.Status.From), slices.Clone(cards)
	for k, c := range cards {
		if s, ok := v1alpha1.ShareOf(r.Status.To, c.Index); ok {
			resized[k].MemoryMiB, resized[k].Cores = s.MemoryMiB, s.Cores
		}
	}
	reg, err := region.Open(filepath.Join(a.RegionDir, enforce.RegionName(ctr.ID)))
	if err != nil {
		return regionRefusal(err)
	}
	defer reg.Close()
	set := func(l []region.Limits) error {
		lockCtx, cancel := context.WithTimeout(ctx, regionLockTimeout)
		defer cancel()
		return reg.SetLimits(lockCtx, l)
	}
	if err := set(to); err != nil {
		return regionRefusal(err)
	}
	if _, shrink := v1alpha1.Compare(r.Status.From, r.Status.To); shrink {
		// The limit is lowered first: from now on no allocation passes it,
		// and what the processes hold is measured.
		use, err := a.Use(ctr.ID)
		if err != nil {
			return a.undo(set, from, ReasonUseUnknown, "the container's use of its cards could not be read: "+err.Error())
		}
		var over []string
		for k, c := range resized {
			if used := use[c.UUID]; used > c.MemoryMiB {
				over = append(over, fmt.Sprintf("%d MiB of card %d, more than the %d MiB asked", used, cards[k].Index, c.MemoryMiB))
			}
		}
		if len(over) > 0 {
			return a.undo(set, from, ReasonInUse, "the container's processes use "+strings.Join(over, "; "))
		}
	}
	a.Resized(ctr.ID, resized)
	return ReasonWritten, "limits written into the container's shared region; running processes see the memory limit at once, the compute limit applies to processes started from now"
}

// undo puts the earlier limits back and returns the refusal.
func (a *Applier) undo(set func([]region.Limits) error, from []region.Limits, reason, message string) (string, string) {
	if err := set(from); err != nil {
		message += "; putting the earlier limits back failed: " + err.Error()
	}
	return reason, message
}

// container finds the running container the resize names and its cards, in
// the order the container sees them (the region's card indices).
func (a *Applier) container(ctx context.Context, r *v1alpha1.GPUShareResize) (nri.Running, []gpuinfo.CardAssignment, bool) {
	for _, ctr := range a.Running() {
		if ctr.Namespace != r.Namespace || ctr.Pod != r.Spec.PodName || ctr.Container != r.Spec.Container || ctr.Unrestricted {
			continue
		}
		for _, h := range ctr.Holdings {
			if h.Key == enforce.ContainerKey(ctr.ID) {
				return ctr, a.indexed(ctx, ctr, slices.Clone(h.Cards)), true
			}
		}
	}
	return nri.Running{}, nil, false
}

// indexed fills in the node's card indices, by UUID from the pod's
// assignment, of cards read back from a container's environment after the
// agent restarted (which name no index).
func (a *Applier) indexed(ctx context.Context, ctr nri.Running, cards []gpuinfo.CardAssignment) []gpuinfo.CardAssignment {
	if !slices.ContainsFunc(cards, func(c gpuinfo.CardAssignment) bool { return c.Index < 0 }) || a.Pod == nil {
		return cards
	}
	pod, err := a.Pod(ctx, ctr.Namespace, ctr.Pod)
	if err != nil {
		return cards
	}
	assigned, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
	if err != nil {
		return cards
	}
	for k := range cards {
		for _, e := range assigned.Containers[ctr.Container] {
			if e.UUID == cards[k].UUID {
				cards[k].Index = e.Index
			}
		}
	}
	return cards
}

// limits are the region limits of shares for the container's cards.
func limits(cards []gpuinfo.CardAssignment, shares []v1alpha1.CardShare) []region.Limits {
	out := make([]region.Limits, len(cards))
	for k, c := range cards {
		s, ok := v1alpha1.ShareOf(shares, c.Index)
		if !ok {
			s = v1alpha1.CardShare{MemoryMiB: c.MemoryMiB, Cores: c.Cores}
		}
		out[k] = region.Limits{MemoryBytes: uint64(max(s.MemoryMiB, 0)) << 20, ComputePercent: uint64(max(s.Cores, 0))}
	}
	return out
}

// regionRefusal is the condition for a region that could not be written.
func regionRefusal(err error) (string, string) {
	var version *region.VersionError
	switch {
	case errors.Is(err, region.ErrNotInitialised):
		return ReasonRegionNotInitialised, "no process of the container has used a GPU yet, so its limits still come from its environment; resize once it has"
	case errors.As(err, &version):
		return ReasonRegionVersion, err.Error()
	default:
		return ReasonRegionUnwritable, err.Error()
	}
}

// reconcile brings every shared container's share, in the agent's view and
// in its region, back to what its pod's assignment says — less, while a
// shrink of it is under way. The view is rebuilt from containers'
// environments when the agent restarts, which a resize does not change; and
// the region is the container's own to write, so limits a process raised
// there are lowered again.
func (a *Applier) reconcile(ctx context.Context, resizes cache.Store) {
	logger := klog.FromContext(ctx)
	shrinking := a.shrinking(resizes)
	for _, ctr := range a.Running() {
		_, cards, ok := a.container(ctx, &v1alpha1.GPUShareResize{
			ObjectMeta: metav1.ObjectMeta{Namespace: ctr.Namespace},
			Spec:       v1alpha1.GPUShareResizeSpec{PodName: ctr.Pod, Container: ctr.Container},
		})
		if !ok || ctr.Unrestricted {
			continue
		}
		pod, err := a.Pod(ctx, ctr.Namespace, ctr.Pod)
		if err != nil || pod.UID != ctr.PodUID {
			continue
		}
		assigned, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			continue
		}
		want := assigned.Containers[ctr.Container]
		if !sameCards(want, cards) || want[0].Cores >= gpuinfo.FullCores {
			continue
		}
		want = slices.Clone(want)
		if to, ok := shrinking[ctr.Namespace+"/"+ctr.Pod+"/"+ctr.Container]; ok {
			for k := range want {
				if s, ok := v1alpha1.ShareOf(to, want[k].Index); ok {
					want[k].MemoryMiB, want[k].Cores = min(want[k].MemoryMiB, s.MemoryMiB), min(want[k].Cores, s.Cores)
				}
			}
		}
		if !slices.Equal(want, cards) {
			logger.V(2).Info("Container's share brought back to its pod's assignment", "pod", klog.KObj(pod), "container", ctr.Container)
			a.Resized(ctr.ID, want)
		}
		a.reconcileRegion(ctx, ctr, want)
	}
}

// reconcileRegion writes want's limits into the container's region where
// they differ; a region not initialised or not supported is left alone.
func (a *Applier) reconcileRegion(ctx context.Context, ctr nri.Running, want []gpuinfo.CardAssignment) {
	reg, err := region.Open(filepath.Join(a.RegionDir, enforce.RegionName(ctr.ID)))
	if err != nil {
		return
	}
	defer reg.Close()
	have, err := reg.Limits()
	if err != nil {
		return
	}
	limits := limits(want, nil)
	for k, l := range limits {
		if have[k] != l {
			klog.FromContext(ctx).Info("Container's limits in its shared region differ from its share; written again",
				"pod", klog.KRef(ctr.Namespace, ctr.Pod), "container", ctr.Container, "card", k,
				"foundMiB", have[k].MemoryBytes>>20, "foundCores", have[k].ComputePercent, "writtenMiB", l.MemoryBytes>>20, "writtenCores", l.ComputePercent)
			lockCtx, cancel := context.WithTimeout(ctx, regionLockTimeout)
			defer cancel()
			_ = reg.SetLimits(lockCtx, limits)
			return
		}
	}
}

// shrinking are the shares asked by the shrinks under way on the node, by
// namespace/pod/container: taken up, not decided, not refused by the agent.
func (a *Applier) shrinking(resizes cache.Store) map[string][]v1alpha1.CardShare {
	out := map[string][]v1alpha1.CardShare{}
	for _, obj := range resizes.List() {
		r := &v1alpha1.GPUShareResize{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, r) != nil {
			continue
		}
		if r.Status.NodeName != a.Node || r.Decided() || meta.IsStatusConditionFalse(r.Status.Conditions, v1alpha1.ConditionLimitsWritten) {
			continue
		}
		if _, shrink := v1alpha1.Compare(r.Status.From, r.Status.To); shrink {
			out[r.Namespace+"/"+r.Spec.PodName+"/"+r.Spec.Container] = r.Status.To
		}
	}
	return out
}

// sameCards reports whether two lists name the same cards in the same order.
func sameCards(a, b []gpuinfo.CardAssignment) bool {
	return len(a) > 0 && slices.EqualFunc(a, b, func(x, y gpuinfo.CardAssignment) bool { return x.UUID == y.UUID })
}
