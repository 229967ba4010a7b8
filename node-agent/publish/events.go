package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Event reasons the agent records.
const (
	// ReasonGPUUnhealthy is on pods whose card turned unhealthy.
	ReasonGPUUnhealthy = "GPUUnhealthy"
	// ReasonEnforcementUnavailable is on a node whose agent cannot enforce
	// assignments (its NRI plugin lost the runtime).
	ReasonEnforcementUnavailable = "GPUEnforcementUnavailable"
	// ReasonEnforcementRestored is on a node whose agent enforces again.
	ReasonEnforcementRestored = "GPUEnforcementRestored"
	// ReasonContainerRefused is on a pod whose container the agent refused
	// to start (an assignment that over-commits a card, a card it was not
	// given, ...).
	ReasonContainerRefused = "GPUContainerRefused"
	// ReasonContainerUnenforced is on a pod whose container the agent found
	// running without enforcement (created while it was disconnected).
	ReasonContainerUnenforced = "GPUContainerUnenforced"
	// ReasonShareExceeded is on a pod whose containers use more of a card
	// than they hold.
	ReasonShareExceeded = "GPUShareExceeded"
	// ReasonMIGSliceUnavailable is on a pod whose MIG slice could not be
	// created on a dynamic card, and is the reason of the pod's Failed
	// phase.
	ReasonMIGSliceUnavailable = "GPUMIGSliceUnavailable"
	// ReasonRightSizeInvalid is on a pod whose right-sizing annotation is
	// invalid: it is not right-sized.
	ReasonRightSizeInvalid = "GPURightSizeInvalid"
)

// ReportExceeded records a Warning Event on the pod (namespace, name, uid):
// note says which of its containers use more of which card than they hold.
func (p *Publisher) ReportExceeded(ctx context.Context, namespace, name string, uid types.UID, note string) error {
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name, UID: uid}
	return p.record(ctx, namespace, name+"-gpu-", "OverUseCheck", ReasonShareExceeded, v1.EventTypeWarning, note, regarding)
}

// ReportUnenforced records a Warning Event on pod: its container was found
// running without enforcement (reason), and stopped or not.
func (p *Publisher) ReportUnenforced(ctx context.Context, pod *v1.Pod, container, reason string, stopped bool) error {
	outcome := "it sees no card, so it keeps running"
	if stopped {
		outcome = "it could see cards it was not given, so the agent stopped it"
	}
	note := fmt.Sprintf("container %q on node %s was created while the node agent could not enforce GPU assignments (%s); %s", container, p.NodeName, reason, outcome)
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	return p.record(ctx, pod.Namespace, pod.Name+"-gpu-", "Audit", ReasonContainerUnenforced, v1.EventTypeWarning, note, regarding)
}

// ReportRightSizeInvalid records a Warning Event on pod: its right-sizing
// annotation is invalid (err says how), so it is not right-sized.
func (p *Publisher) ReportRightSizeInvalid(ctx context.Context, pod *v1.Pod, err error) error {
	note := fmt.Sprintf("%v; the pod's GPU shares are not right-sized", err)
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	return p.record(ctx, pod.Namespace, pod.Name+"-gpu-", "RightSize", ReasonRightSizeInvalid, v1.EventTypeWarning, note, regarding)
}

// ReportRefusal records a Warning Event on pod: its container could not
// start, for reason.
func (p *Publisher) ReportRefusal(ctx context.Context, pod *v1.Pod, container, reason string) error {
	note := fmt.Sprintf("container %q was not started on node %s: %s", container, p.NodeName, reason)
	if len(note) > maxNote {
		note = note[:maxNote-3] + "..."
	}
	regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	return p.record(ctx, pod.Namespace, pod.Name+"-gpu-", "CreateContainer", ReasonContainerRefused, v1.EventTypeWarning, note, regarding)
}

// FailPod marks pod Failed with reason ReasonMIGSliceUnavailable and the
// message why, so that its cards are freed and its owner may replace it
// (kubelet stops a pod another client marked Failed), and records the same
// as a Warning Event. The pod's UID is a precondition: a pod recreated under
// the same name is left alone.
func (p *Publisher) FailPod(ctx context.Context, pod *v1.Pod, why string) error {
	message := fmt.Sprintf("node %s: %s", p.NodeName, why)
	if len(message) > maxNote {
		message = message[:maxNote-3] + "..."
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   map[string]any{"phase": v1.PodFailed, "reason": ReasonMIGSliceUnavailable, "message": message},
	})
	if err != nil {
		return err
	}
	if _, err := p.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("marking pod %s/%s Failed: %w", pod.Namespace, pod.Name, err)
	}
	regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	return p.record(ctx, pod.Namespace, pod.Name+"-gpu-", "CreateMIGSlice", ReasonMIGSliceUnavailable, v1.EventTypeWarning, message, regarding)
}

// maxNote is the longest note the API accepts on an Event.
const maxNote = 1024

// ReportEnforcement records on the Node that the agent cannot enforce
// assignments (notReady says why) or, with notReady empty, that it can again.
func (p *Publisher) ReportEnforcement(ctx context.Context, notReady string) error {
	node, err := p.Client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading node %s: %w", p.NodeName, err)
	}
	reason, typ, note := ReasonEnforcementRestored, v1.EventTypeNormal, "GPU assignments are enforced again; the scheduler places GPU pods here again"
	if notReady != "" {
		reason, typ = ReasonEnforcementUnavailable, v1.EventTypeWarning
		note = "GPU assignments cannot be enforced (" + notReady + "); the scheduler places no GPU pod here and GPU containers cannot start until it recovers"
	}
	return p.record(ctx, metav1.NamespaceDefault, node.Name+"-gpu-", "HealthCheck", reason, typ, note,
		v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID})
}

// record creates one Event from this node's agent.
func (p *Publisher) record(ctx context.Context, namespace, generateName, action, reason, typ, note string, regarding v1.ObjectReference) error {
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: generateName, Namespace: namespace},
		EventTime:           metav1.NewMicroTime(p.now()),
		ReportingController: "tessera.io/node-agent",
		ReportingInstance:   p.NodeName,
		Action:              action,
		Reason:              reason,
		Type:                typ,
		Regarding:           regarding,
		Note:                note,
	}
	_, err := p.Client.EventsV1().Events(namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// ReportUnhealthyCard records a Warning Event on every pod of the node that
// holds the card: the pod keeps running, its owner is told. It returns how
// many pods were told.
func (p *Publisher) ReportUnhealthyCard(ctx context.Context, uuid, reason string) (int, error) {
	pods, err := p.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.NodeName).String(),
	})
	if err != nil {
		return 0, fmt.Errorf("listing pods on node %s: %w", p.NodeName, err)
	}
	told := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !holds(pod, uuid) {
			continue
		}
		note := fmt.Sprintf("GPU %s on node %s became unhealthy (%s); the pod keeps running, new pods will not be placed on the card", uuid, p.NodeName, reason)
		regarding := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
		if err := p.record(ctx, pod.Namespace, pod.Name+"-gpu-", "HealthCheck", ReasonGPUUnhealthy, v1.EventTypeWarning, note, regarding); err != nil {
			return told, fmt.Errorf("recording an event on pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		told++
	}
	return told, nil
}

// holds reports whether the pod's assignment names the card.
func holds(pod *v1.Pod, uuid string) bool {
	raw, ok := pod.Annotations[gpuinfo.AssignmentAnnotation]
	if !ok || !strings.Contains(raw, uuid) {
		return false
	}
	a, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		return false
	}
	for _, cards := range a.Containers {
		for _, c := range cards {
			if c.UUID == uuid {
				return true
			}
		}
	}
	return false
}
