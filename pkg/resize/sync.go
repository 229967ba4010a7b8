package resize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// Reasons of the controller's conditions.
const (
	ReasonPodNotFound          = "PodNotFound"
	ReasonNotPlaced            = "NotPlaced"
	ReasonPodFinished          = "PodFinished"
	ReasonNoShare              = "NoShare"
	ReasonWholeCards           = "WholeCards"
	ReasonInvalidShare         = "InvalidShare"
	ReasonBeyondRequest        = "BeyondRequest"
	ReasonGrowAndShrink        = "GrowAndShrink"
	ReasonAnotherResize        = "AnotherResizeInProgress"
	ReasonNoRoom               = "NoRoom"
	ReasonNodeAgentSilent      = "NodeAgentSilent"
	ReasonUnchanged            = "Unchanged"
	ReasonApplied              = "Applied"
	ReasonCommitting           = "Committing"
	ReasonWaitingForNodeAgent  = v1alpha1.ReasonWaitingForNodeAgent
	ReasonWaitingForPreemption = "WaitingForPreemption"
)

// Event reasons on the pod.
const (
	eventApplied = "GPUShareResized"
	eventRefused = "GPUShareResizeRefused"
)

// preemptionRetry is how soon a grow waiting for a preemption on its node
// is tried again.
const preemptionRetry = 5 * time.Second

// sync takes a resize one step: it takes it up (checks it, records the
// shares from and to), commits a grow on the ledger and the pod, and
// follows the agent's report to Applied or Refused. Every step is
// idempotent: it starts from what the API says. It returns when to look
// again (0: on the next change of the resize).
func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	obj, exists, err := c.informer.GetStore().GetByKey(key)
	if err != nil || !exists {
		return 0, err
	}
	r := &v1alpha1.GPUShareResize{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, r); err != nil {
		c.logger.Error(err, "GPUShareResize cannot be read; it is left alone", "resize", key)
		return 0, nil
	}
	if r.Decided() {
		return 0, nil
	}
	logger := klog.LoggerWithValues(c.logger, "resize", klog.KObj(r), "pod", klog.KRef(r.Namespace, r.Spec.PodName))
	ctx = klog.NewContext(ctx, logger)
	pod, err := c.Pod(r.Namespace, r.Spec.PodName)
	switch {
	case apierrors.IsNotFound(err):
		return c.refuse(ctx, r, nil, ReasonPodNotFound, "pod %s does not exist (or has finished)", r.Spec.PodName)
	case err != nil:
		return 0, err
	case pod.DeletionTimestamp != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return c.refuse(ctx, r, pod, ReasonPodFinished, "pod %s is finishing or has finished", pod.Name)
	case r.Status.NodeName != "" && r.Status.NodeName != pod.Spec.NodeName:
		// The name was reused by a pod placed elsewhere.
		return c.refuse(ctx, r, pod, ReasonPodFinished, "pod %s was replaced", pod.Name)
	}
	if r.Status.NodeName == "" {
		return c.takeUp(ctx, r, pod)
	}
	return c.follow(ctx, r, pod)
}

// takeUp checks a new resize and records in its status the node and the
// shares from and to.
func (c *Controller) takeUp(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod) (time.Duration, error) {
	if pod.Spec.NodeName == "" {
		return c.refuse(ctx, r, pod, ReasonNotPlaced, "pod %s is not placed yet; resize it once it runs", pod.Name)
	}
	_, entries, err := c.containerShares(pod, r.Spec.Container)
	if err != nil {
		return c.refuse(ctx, r, pod, ReasonNoShare, "%v", err)
	}
	for _, e := range entries {
		if e.MIG != nil || e.Cores >= gpuinfo.FullCores {
			return c.refuse(ctx, r, pod, ReasonWholeCards, "container %q holds whole cards or MIG slices; only shares of cards are resized", r.Spec.Container)
		}
	}
	if other := c.inProgress(r); other != "" {
		return c.refuse(ctx, r, pod, ReasonAnotherResize, "resize %s of container %q is in progress; ask again once it is decided", other, r.Spec.Container)
	}
	asked, limits, err := c.requested(pod, r.Spec.Container, entries)
	var noShare noShareError
	switch {
	case errors.As(err, &noShare):
		return c.refuse(ctx, r, pod, ReasonNoShare, "%v", err)
	case err != nil:
		return 0, err
	}
	from, to := shares(entries), shares(entries)
	for k, e := range entries {
		if r.Spec.Memory != nil {
			to[k].MemoryMiB = r.Spec.Memory.Value() >> 20
		}
		if r.Spec.Cores != nil {
			to[k].Cores = *r.Spec.Cores
		}
		if to[k].MemoryMiB < 1 {
			return c.refuse(ctx, r, pod, ReasonInvalidShare, "memory %s is less than 1 MiB", r.Spec.Memory)
		}
		if limit := limits[k]; to[k].MemoryMiB > limit || to[k].Cores > asked.Cores {
			return c.refuse(ctx, r, pod, ReasonBeyondRequest,
				"container %q asks for %d MiB and %d%% compute of card %d, which ResourceQuota and Kueue count; a share beyond the request is not given (run a pod that asks for more)",
				r.Spec.Container, limit, asked.Cores, e.Index)
		}
	}
	grow, shrink := v1alpha1.Compare(from, to)
	switch {
	case !grow && !shrink:
		return c.apply(ctx, r, pod, ReasonUnchanged, "container %q already holds this share", r.Spec.Container)
	case grow && shrink:
		return c.refuse(ctx, r, pod, ReasonGrowAndShrink, "the resize grows one part of the share and shrinks another; ask for each in a resize of its own")
	}
	r.Status.NodeName, r.Status.From, r.Status.To, r.Status.ObservedGeneration = pod.Spec.NodeName, from, to, r.Generation
	reason, message := ReasonWaitingForNodeAgent, "the node agent lowers the limits and checks the container's use"
	if grow {
		reason, message = ReasonCommitting, "the new share is being recorded"
	}
	c.setCondition(r, v1alpha1.ConditionPending, metav1.ConditionTrue, reason, message)
	if err := c.writeStatus(ctx, r); err != nil {
		return 0, err
	}
	c.takenUp.Store(containerKey(r), r.Name)
	return 0, nil
}

// containerKey names the container a resize is of: namespace/pod/container.
func containerKey(r *v1alpha1.GPUShareResize) string {
	return r.Namespace + "/" + r.Spec.PodName + "/" + r.Spec.Container
}

// follow takes a resize whose shares are recorded in its status to its end:
// a grow is committed (ledger, then the pod's annotation) before the agent
// raises the limits; a shrink is committed once the agent has lowered them.
func (c *Controller) follow(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod) (time.Duration, error) {
	_, entries, err := c.containerShares(pod, r.Spec.Container)
	if err != nil {
		return c.refuse(ctx, r, pod, ReasonNoShare, "%v", err)
	}
	grow, _ := v1alpha1.Compare(r.Status.From, r.Status.To)
	committed := slices.Equal(shares(entries), r.Status.To)
	pending := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionPending)
	if grow && pending != nil && pending.Reason != ReasonWaitingForNodeAgent {
		return c.commitGrow(ctx, r, pod)
	}
	report := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionLimitsWritten)
	switch {
	case report != nil && report.Status == metav1.ConditionTrue:
		if !committed {
			if err := c.record(ctx, pod, r.Spec.Container, r.Status.To); err != nil {
				return 0, fmt.Errorf("recording the shrunk share on pod %s: %w", pod.Name, err)
			}
		}
		return c.apply(ctx, r, pod, ReasonApplied, "container %q holds %s", r.Spec.Container, describe(r.Status.To))
	case report != nil && report.Status == metav1.ConditionFalse:
		return c.undo(ctx, r, pod, grow, report.Reason, "the node agent did not apply it: "+report.Message)
	}
	if pending != nil && c.now().Sub(pending.LastTransitionTime.Time) >= c.AgentTimeout {
		return c.undo(ctx, r, pod, grow, ReasonNodeAgentSilent,
			fmt.Sprintf("the node agent of %s did not report within %v", r.Status.NodeName, c.AgentTimeout))
	}
	return c.agentDeadline(r), nil
}

// commitGrow holds the grown share on the ledger and records it on the
// pod, unless a preemption is under way on the node; then the agent is
// waited for.
func (c *Controller) commitGrow(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod) (time.Duration, error) {
	if c.Nominated(pod.Spec.NodeName) {
		if c.setCondition(r, v1alpha1.ConditionPending, metav1.ConditionTrue, ReasonWaitingForPreemption,
			"a preemption is under way on node "+pod.Spec.NodeName+"; the grow waits for it to end") {
			return preemptionRetry, c.writeStatus(ctx, r)
		}
		return preemptionRetry, nil
	}
	live, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	a, entries, err := c.containerShares(live, r.Spec.Container)
	if err != nil {
		return c.refuse(ctx, r, pod, ReasonNoShare, "%v", err)
	}
	// An earlier try recorded it already (its status was not written).
	if !slices.Equal(shares(entries), r.Status.To) {
		// Held on the ledger first: until the pod's annotation says it, no
		// placement takes the room.
		if err := c.Ledger.Resize(live.UID, withShares(a, r.Spec.Container, r.Status.To), nil); err != nil {
			if errors.Is(err, ledger.ErrNoRoom) {
				return c.refuse(ctx, r, pod, ReasonNoRoom, "%v", err)
			}
			return 0, err
		}
		if err := c.patch(ctx, live, withShares(a, r.Spec.Container, r.Status.To)); err != nil {
			if !c.recorded(ctx, pod, r.Spec.Container, r.Status.To) {
				c.Ledger.ForgetResize(live.UID)
			}
			return 0, fmt.Errorf("recording the grown share on pod %s: %w", pod.Name, err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Grown share recorded", "shares", describe(r.Status.To))
	c.setCondition(r, v1alpha1.ConditionPending, metav1.ConditionTrue, ReasonWaitingForNodeAgent, "the share is recorded; the node agent raises the limits")
	return c.AgentTimeout, c.writeStatus(ctx, r)
}

// undo refuses a resize, first putting back the pod's share when a grow
// was committed.
func (c *Controller) undo(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod, grow bool, reason, message string) (time.Duration, error) {
	if grow {
		if err := c.record(ctx, pod, r.Spec.Container, r.Status.From); err != nil {
			return 0, fmt.Errorf("putting back the share of pod %s: %w", pod.Name, err)
		}
		c.Ledger.ForgetResize(pod.UID)
	}
	return c.refuse(ctx, r, pod, reason, "%s", message)
}

// agentDeadline is how long until the wait for the agent's report ends.
func (c *Controller) agentDeadline(r *v1alpha1.GPUShareResize) time.Duration {
	pending := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionPending)
	if pending == nil {
		return c.AgentTimeout
	}
	return max(pending.LastTransitionTime.Add(c.AgentTimeout).Sub(c.now()), time.Second)
}

// noShareError says the pod's spec asks for no GPU share of the container.
type noShareError struct{ msg string }

func (e noShareError) Error() string { return e.msg }

// requested is what the container asks for in the pod's spec, and its
// memory limit on each of its cards (entries), by the ledger's card sizes.
// A noShareError says the spec asks for no share.
func (c *Controller) requested(pod *v1.Pod, container string, entries []gpuinfo.CardAssignment) (gpuinfo.ContainerRequest, []int64, error) {
	req, err := gpuinfo.ParsePodRequest(pod, c.Names)
	if err != nil || req == nil {
		return gpuinfo.ContainerRequest{}, nil, noShareError{fmt.Sprintf("pod %s asks for no GPU share the resize could change: %v", pod.Name, err)}
	}
	i := slices.IndexFunc(req.Containers, func(cr gpuinfo.ContainerRequest) bool { return cr.Name == container })
	if i < 0 {
		return gpuinfo.ContainerRequest{}, nil, noShareError{fmt.Sprintf("container %q asks for no GPU share", container)}
	}
	cards := c.Ledger.NodeCards(pod.Spec.NodeName)
	limits := make([]int64, len(entries))
	for k, e := range entries {
		card := slices.IndexFunc(cards, func(cu ledger.CardUsage) bool { return cu.Index == e.Index && cu.Slice == nil })
		if card < 0 {
			return gpuinfo.ContainerRequest{}, nil, fmt.Errorf("card %d of node %s is not in the ledger", e.Index, pod.Spec.NodeName)
		}
		limits[k] = req.Containers[i].MemoryOn(cards[card].Capacity.MemoryMiB)
	}
	return req.Containers[i], limits, nil
}

// containerShares decodes the pod's assignment and the container's cards
// in it.
func (c *Controller) containerShares(pod *v1.Pod, container string) (*gpuinfo.Assignment, []gpuinfo.CardAssignment, error) {
	raw, ok := pod.Annotations[gpuinfo.AssignmentAnnotation]
	if !ok {
		return nil, nil, fmt.Errorf("pod %s holds no cards (Tessera placed no GPUs for it)", pod.Name)
	}
	a, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("pod %s: its assignment is invalid: %w", pod.Name, err)
	}
	entries := a.Containers[container]
	if len(entries) == 0 {
		return nil, nil, fmt.Errorf("container %q of pod %s holds no GPU share", container, pod.Name)
	}
	return a, entries, nil
}

// inProgress names another resize of the same container taken up and not
// decided, or returns "".
// The informer may not have seen the status of one this controller has
// just taken up (two resizes created at once): that one counts until the
// informer has it decided, or deleted.
func (c *Controller) inProgress(r *v1alpha1.GPUShareResize) string {
	last, _ := c.takenUp.Load(containerKey(r))
	for _, other := range c.resizesOf(r.Namespace, r.Spec.PodName) {
		if other.Name == r.Name || other.Spec.Container != r.Spec.Container || other.Decided() {
			continue
		}
		if other.Status.NodeName != "" || other.Name == last {
			return other.Name
		}
	}
	if last != nil {
		c.takenUp.CompareAndDelete(containerKey(r), last) // decided, or gone
	}
	return ""
}

// shares are the container's shares per card.
func shares(entries []gpuinfo.CardAssignment) []v1alpha1.CardShare {
	out := make([]v1alpha1.CardShare, len(entries))
	for i, e := range entries {
		out[i] = v1alpha1.CardShare{Index: e.Index, MemoryMiB: e.MemoryMiB, Cores: e.Cores}
	}
	return out
}

// withShares is a copy of a with the container's shares set to to, card by
// card.
func withShares(a *gpuinfo.Assignment, container string, to []v1alpha1.CardShare) *gpuinfo.Assignment {
	out := &gpuinfo.Assignment{Version: a.Version, Containers: make(map[string][]gpuinfo.CardAssignment, len(a.Containers))}
	for name, entries := range a.Containers {
		out.Containers[name] = slices.Clone(entries)
	}
	for i, e := range out.Containers[container] {
		if s, ok := v1alpha1.ShareOf(to, e.Index); ok {
			out.Containers[container][i].MemoryMiB, out.Containers[container][i].Cores = s.MemoryMiB, s.Cores
		}
	}
	return out
}

// describe is a share for messages: "8192 MiB and 30% of card 0".
func describe(s []v1alpha1.CardShare) string {
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = fmt.Sprintf("%d MiB and %d%% of card %d", c.MemoryMiB, c.Cores, c.Index)
	}
	return strings.Join(parts, ", ")
}

// record sets the container's shares in the pod's assignment annotation to
// to, reading the pod from the API (the informer's copy may be behind).
func (c *Controller) record(ctx context.Context, pod *v1.Pod, container string, to []v1alpha1.CardShare) error {
	live, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	a, entries, err := c.containerShares(live, container)
	if err != nil || slices.Equal(shares(entries), to) {
		return err
	}
	return c.patch(ctx, live, withShares(a, container, to))
}

// recorded reports whether the pod's annotation, read from the API, says
// the container holds to (a patch that failed may have been applied).
func (c *Controller) recorded(ctx context.Context, pod *v1.Pod, container string, to []v1alpha1.CardShare) bool {
	live, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return true // unknown: the room stays held until the pod says
	}
	_, entries, err := c.containerShares(live, container)
	return err == nil && slices.Equal(shares(entries), to)
}

// patch writes a into the pod's assignment annotation, provided the
// annotation is still the one read (a JSON patch's test).
func (c *Controller) patch(ctx context.Context, pod *v1.Pod, a *gpuinfo.Assignment) error {
	raw, err := a.Encode()
	if err != nil {
		return err
	}
	path := "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(gpuinfo.AssignmentAnnotation)
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": pod.Annotations[gpuinfo.AssignmentAnnotation]},
		{"op": "replace", "path": path, "value": raw},
	})
	if err != nil {
		return err
	}
	_, err = c.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

// fieldManager names the controller's writes.
const fieldManager = "tessera-resize"

// setCondition sets a condition of the resize and reports whether it
// changed. A new reason restarts its transition time: the wait for the
// agent is timed from when it began.
func (c *Controller) setCondition(r *v1alpha1.GPUShareResize, kind string, status metav1.ConditionStatus, reason, message string) bool {
	if old := meta.FindStatusCondition(r.Status.Conditions, kind); old != nil && old.Reason != reason {
		meta.RemoveStatusCondition(&r.Status.Conditions, kind)
	}
	return meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
		Type: kind, Status: status, Reason: reason, Message: message, ObservedGeneration: r.Generation,
		LastTransitionTime: metav1.NewTime(c.now()),
	})
}

// refuse ends the resize as refused, telling its owner on the pod too.
func (c *Controller) refuse(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod, reason, format string, args ...any) (time.Duration, error) {
	message := fmt.Sprintf(format, args...)
	klog.FromContext(ctx).Info("GPU share resize refused", "reason", reason, "message", message)
	c.setCondition(r, v1alpha1.ConditionPending, metav1.ConditionFalse, reason, "decided")
	c.setCondition(r, v1alpha1.ConditionRefused, metav1.ConditionTrue, reason, message)
	if err := c.writeStatus(ctx, r); err != nil {
		return 0, err
	}
	c.event(pod, v1.EventTypeWarning, eventRefused, "GPUShareResize %s refused (%s): %s", r.Name, reason, message)
	return 0, nil
}

// apply ends the resize as applied.
func (c *Controller) apply(ctx context.Context, r *v1alpha1.GPUShareResize, pod *v1.Pod, reason, format string, args ...any) (time.Duration, error) {
	message := fmt.Sprintf(format, args...)
	klog.FromContext(ctx).V(2).Info("GPU share resized", "message", message)
	c.setCondition(r, v1alpha1.ConditionPending, metav1.ConditionFalse, reason, "decided")
	c.setCondition(r, v1alpha1.ConditionApplied, metav1.ConditionTrue, reason, message)
	if err := c.writeStatus(ctx, r); err != nil {
		return 0, err
	}
	c.event(pod, v1.EventTypeNormal, eventApplied, "GPUShareResize %s: %s", r.Name, message)
	return 0, nil
}

// writeStatus writes the resize's status (an update: a conflict with the
// agent's report is retried from the newer object).
func (c *Controller) writeStatus(ctx context.Context, r *v1alpha1.GPUShareResize) error {
	u, err := r.Unstructured()
	if err != nil {
		return err
	}
	_, err = c.resizes.Namespace(r.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	return err
}
