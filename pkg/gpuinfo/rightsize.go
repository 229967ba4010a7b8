package gpuinfo

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// RightSizeAnnotation, on a pod, opts its GPU memory shares in to
	// automatic right-sizing (docs/resize.md): "true" for the default quiet
	// period, or the quiet period itself, a duration from MinQuietPeriod to
	// MaxQuietPeriod ("2h"). After a quiet period the share shrinks to the
	// peak use measured over it plus a margin; it is restored, up to the
	// request, when use comes near the smaller limit.
	RightSizeAnnotation = Domain + "/right-size"
	// AgentUseAnnotation, on a node agent's heartbeat Lease, carries the GPU
	// memory use of the node's containers whose pods opted in to
	// right-sizing: JSON, a UseReport.
	AgentUseAnnotation = Domain + "/gpu-use"

	// DefaultQuietPeriod is the quiet period of RightSizeAnnotation "true".
	DefaultQuietPeriod = 30 * time.Minute
	// MinQuietPeriod and MaxQuietPeriod bound the quiet period a pod may
	// ask for: shorter would shrink a share between two bursts of one job,
	// longer than the agent keeps its readings.
	MinQuietPeriod = time.Minute
	MaxQuietPeriod = 24 * time.Hour
)

// QuietPeriod reads the pod's RightSizeAnnotation: whether the pod opted
// in, and its quiet period. An invalid value is an error naming the pod and
// the annotation (the pod is then not right-sized).
func QuietPeriod(pod *v1.Pod) (time.Duration, bool, error) {
	raw, ok := pod.Annotations[RightSizeAnnotation]
	switch {
	case !ok || raw == "false":
		return 0, false, nil
	case raw == "true":
		return DefaultQuietPeriod, true, nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < MinQuietPeriod || d > MaxQuietPeriod {
		return 0, false, fmt.Errorf("pod %s/%s: annotation %s=%q: want \"true\", \"false\" or a quiet period from %v to %v (e.g. \"2h\")",
			pod.Namespace, pod.Name, RightSizeAnnotation, raw, MinQuietPeriod, MaxQuietPeriod)
	}
	return d, true, nil
}

// UseReport is the AgentUseAnnotation: what each opted-in container on the
// node uses.
type UseReport struct {
	Containers []ContainerUse `json:"containers"`
}

// ContainerUse is one container's GPU memory use, measured by its node's
// agent with NVML from outside the container, in MiB on the busiest of its
// cards.
type ContainerUse struct {
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	UID       types.UID `json:"uid"`
	Container string    `json:"container"`
	// UseMiB is the last reading.
	UseMiB int64 `json:"useMiB"`
	// PeakMiB is the highest reading over the last WindowSeconds.
	PeakMiB int64 `json:"peakMiB"`
	// WindowSeconds is how long the peak covers: the pod's quiet period,
	// or less while the agent has read the container for less.
	WindowSeconds int64 `json:"windowSeconds"`
}

// Validate checks the report's figures.
func (r *UseReport) Validate() error {
	for i, c := range r.Containers {
		switch {
		case c.Namespace == "" || c.Pod == "" || c.Container == "":
			return fmt.Errorf("containers[%d]: namespace, pod and container are required", i)
		case c.UseMiB < 0 || c.UseMiB > MaxCardMemoryMiB || c.PeakMiB < c.UseMiB || c.PeakMiB > MaxCardMemoryMiB:
			return fmt.Errorf("containers[%d] (%s/%s %q): useMiB %d and peakMiB %d: want 0 <= useMiB <= peakMiB <= %d",
				i, c.Namespace, c.Pod, c.Container, c.UseMiB, c.PeakMiB, MaxCardMemoryMiB)
		case c.WindowSeconds < 0 || c.WindowSeconds > int64(MaxQuietPeriod/time.Second):
			return fmt.Errorf("containers[%d] (%s/%s %q): windowSeconds %d: want 0 to %d",
				i, c.Namespace, c.Pod, c.Container, c.WindowSeconds, int64(MaxQuietPeriod/time.Second))
		}
	}
	return nil
}

// Window is the time the peak covers.
func (c ContainerUse) Window() time.Duration { return time.Duration(c.WindowSeconds) * time.Second }

// Encode returns the annotation's value.
func (r *UseReport) Encode() (string, error) { return encodeAnnotation(r) }

// DecodeUseReport parses and validates an AgentUseAnnotation.
func DecodeUseReport(raw string) (*UseReport, error) {
	r := &UseReport{}
	if err := decodeAnnotation(AgentUseAnnotation, raw, r); err != nil {
		return nil, err
	}
	return r, nil
}
