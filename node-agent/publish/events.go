package publish

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ReasonGPUUnhealthy is the Event reason on pods whose card turned unhealthy.
const ReasonGPUUnhealthy = "GPUUnhealthy"

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
		now := metav1.NewMicroTime(p.now())
		ev := &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{GenerateName: pod.Name + "-gpu-", Namespace: pod.Namespace},
			EventTime:           now,
			ReportingController: "tessera.io/node-agent",
			ReportingInstance:   p.NodeName,
			Action:              "HealthCheck",
			Reason:              ReasonGPUUnhealthy,
			Type:                v1.EventTypeWarning,
			Regarding:           v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			Note:                fmt.Sprintf("GPU %s on node %s became unhealthy (%s); the pod keeps running, new pods will not be placed on the card", uuid, p.NodeName, reason),
		}
		if _, err := p.Client.EventsV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
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
