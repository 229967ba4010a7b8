package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

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

// containerOf returns the ID of the known container whose cgroup holds the
// process, from procRoot/<pid>/cgroup, or "". The runtimes put the
// container's ID in the cgroup's path, whatever the cgroup driver:
// ".../cri-containerd-<id>.scope" (systemd), ".../pod<uid>/<id>" (cgroupfs),
// ".../crio-<id>.scope" (CRI-O).
func containerOf(procRoot string, pid uint32, known map[string]containerRef) string {
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return ""
	}
	for _, word := range strings.FieldsFunc(string(raw), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if _, ok := known[word]; ok {
			return word
		}
	}
	return ""
}
