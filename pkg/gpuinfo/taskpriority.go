package gpuinfo

import "fmt"

// TaskPriority is a container's priority on a shared card, as the CUDA
// interception library applies it: while a high-priority task computes on a
// card, the low-priority tasks on that card are held back.
type TaskPriority string

// The task priorities.
const (
	TaskPriorityHigh TaskPriority = "high"
	TaskPriorityLow  TaskPriority = "low"
)

// ParseTaskPriority reads a pod's TaskPriorityAnnotation: "" when it is not
// set, an error naming the annotation when it is neither "high" nor "low".
func ParseTaskPriority(annotations map[string]string) (TaskPriority, error) {
	raw, ok := annotations[TaskPriorityAnnotation]
	if !ok {
		return "", nil
	}
	switch p := TaskPriority(raw); p {
	case TaskPriorityHigh, TaskPriorityLow:
		return p, nil
	}
	if len(raw) > 32 {
		raw = raw[:32] + "..."
	}
	return "", fmt.Errorf("annotation %s: must be %q or %q, got %q", TaskPriorityAnnotation, TaskPriorityHigh, TaskPriorityLow, raw)
}
