package metrics

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// containerRef names a container of a pod on the node.
type containerRef struct{ namespace, pod, container string }

// containerIDs maps the runtime's ID of every container the pods' statuses
// name (without the "containerd://" prefix) to the container.
func containerIDs(pods []*v1.Pod) map[string]containerRef {
	ids := map[string]containerRef{}
	for _, pod := range pods {
		for _, statuses := range [][]v1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
			for _, s := range statuses {
				_, id, ok := strings.Cut(s.ContainerID, "://")
				if !ok || id == "" {
					continue
				}
				ids[id] = containerRef{pod.Namespace, pod.Name, s.Name}
			}
		}
	}
	return ids
}
