package gpuinfo

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerKind says when a container runs relative to the others, which
// decides whether its cards add to the pod's demand or can be reused.
type ContainerKind uint8

const (
	// AppContainer is a regular container; all of them run together.
	AppContainer ContainerKind = iota
	// InitContainer is a regular init container; it runs alone (beside the
	// sidecars started before it) and finishes before the app containers start,
	// so the app containers can reuse its cards.
	InitContainer
	// SidecarContainer is a restartable init container; it runs from its start
	// until the pod ends, alongside later init containers and the app containers.
	SidecarContainer
)

// ContainerRequest is one container's validated GPU request.
type ContainerRequest struct {
	// Name is the container's name.
	Name string
	// Kind says when the container runs.
	Kind ContainerKind
	// Count is the number of distinct cards, at least 1.
	Count int
	// MemoryMiB is the memory on each card; 0 when MemoryPercent or the whole
	// card is asked for.
	MemoryMiB int64
	// MemoryPercent is the share of each card's memory, 1-100; 0 when unused.
	MemoryPercent int64
	// Cores is the compute share of each card, 0-100; FullCores means the
	// cards are held exclusively.
	Cores int64
}

// Exclusive reports whether the container holds its cards alone.
func (c *ContainerRequest) Exclusive() bool { return c.Cores >= FullCores }

// MemoryOn returns the memory in MiB the container gets on a card with
// cardMemoryMiB of memory: the fixed amount, the percentage, or, when neither
// was given, the whole card.
func (c *ContainerRequest) MemoryOn(cardMemoryMiB int64) int64 {
	switch {
	case c.MemoryMiB > 0:
		return c.MemoryMiB
	case c.MemoryPercent > 0:
		return cardMemoryMiB * c.MemoryPercent / 100
	default:
		return cardMemoryMiB
	}
}

// PodRequest is a pod's validated GPU request: every container that asks for
// GPUs, init containers first in declaration order, then app containers.
type PodRequest struct {
	Containers []ContainerRequest
	// Selector restricts which cards qualify.
	Selector Selector
	// TaskPriority is the pod's TaskPriorityAnnotation, "" when unset.
	TaskPriority TaskPriority
	// Isolation is the pod's IsolationAnnotation.
	Isolation Isolation
	// MIGProfile, when set, is the only MIG profile whose slices serve the
	// pod (MIGProfileAnnotation).
	MIGProfile string
	// Topology is the link class every two cards of a multi-card container
	// must have between them (TopologyAnnotation); LinkUnknown requires
	// none.
	Topology LinkClass
}

// ParsePodRequest reads a pod's GPU request. It returns nil, nil when no
// container asks for GPUs, and an error naming the container and resource when
// a request is invalid.
func ParsePodRequest(pod *v1.Pod, names ResourceNames) (*PodRequest, error) {
	var req *PodRequest
	add := func(c *v1.Container, kind ContainerKind) error {
		cr, ok, err := parseContainer(c, kind, names)
		if err != nil || !ok {
			return err
		}
		if req == nil {
			req = &PodRequest{}
		}
		req.Containers = append(req.Containers, cr)
		return nil
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if err := add(c, initKind(c)); err != nil {
			return nil, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := add(&pod.Spec.Containers[i], AppContainer); err != nil {
			return nil, err
		}
	}
	if req == nil {
		return nil, nil
	}
	sel, err := ParseSelector(pod.Annotations)
	if err != nil {
		return nil, err
	}
	req.Selector = sel
	if req.TaskPriority, err = ParseTaskPriority(pod.Annotations); err != nil {
		return nil, err
	}
	if req.Isolation, req.MIGProfile, err = parseIsolation(pod.Annotations, req.Containers, names); err != nil {
		return nil, err
	}
	if req.Topology, err = parseTopology(pod.Annotations); err != nil {
		return nil, err
	}
	return req, nil
}

// NamedContainer is a container's name and kind.
type NamedContainer struct {
	Name string
	Kind ContainerKind
}

// ContainerOrder lists the pod's containers in the order they start: init
// containers (regular and sidecar) as declared, then the app containers.
func ContainerOrder(pod *v1.Pod) []NamedContainer {
	order := make([]NamedContainer, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		order = append(order, NamedContainer{Name: c.Name, Kind: initKind(c)})
	}
	for i := range pod.Spec.Containers {
		order = append(order, NamedContainer{Name: pod.Spec.Containers[i].Name, Kind: AppContainer})
	}
	return order
}

func initKind(c *v1.Container) ContainerKind {
	if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
		return SidecarContainer
	}
	return InitContainer
}

// quantity returns the container's value for name from its limits, or from its
// requests when the limits do not name it.
func quantity(c *v1.Container, name v1.ResourceName) (resource.Quantity, bool) {
	if q, ok := c.Resources.Limits[name]; ok {
		return q, true
	}
	q, ok := c.Resources.Requests[name]
	return q, ok
}

func parseContainer(c *v1.Container, kind ContainerKind, names ResourceNames) (ContainerRequest, bool, error) {
	cr := ContainerRequest{Name: c.Name, Kind: kind}
	fieldErr := func(name v1.ResourceName, format string, args ...any) error {
		return fmt.Errorf("container %q: resource %s: %s", c.Name, name, fmt.Sprintf(format, args...))
	}
	count, hasCount := quantity(c, names.GPU)
	mem, hasMem := quantity(c, names.Memory)
	pct, hasPct := quantity(c, names.MemoryPercent)
	cores, hasCores := quantity(c, names.Cores)
	if !hasCount && !hasMem && !hasPct && !hasCores {
		return cr, false, nil
	}
	cr.Count = 1
	if hasCount {
		n, ok := count.AsInt64()
		if !ok || n < 1 {
			return cr, false, fieldErr(names.GPU, "must be a whole number of cards, at least 1, got %s", count.String())
		}
		if n > MaxCardsPerNode {
			return cr, false, fieldErr(names.GPU, "%d cards is more than a node can have (%d)", n, MaxCardsPerNode)
		}
		cr.Count = int(n)
	}
	if hasMem && hasPct {
		return cr, false, fieldErr(names.MemoryPercent, "cannot be combined with %s; give one of them", names.Memory)
	}
	if hasMem {
		n, ok := mem.AsInt64()
		if !ok || n < 1 {
			return cr, false, fieldErr(names.Memory, "must be a whole number of MiB, at least 1, got %s", mem.String())
		}
		if n > MaxCardMemoryMiB {
			return cr, false, fieldErr(names.Memory, "%d MiB is more than any card has (at most %d MiB)", n, MaxCardMemoryMiB)
		}
		cr.MemoryMiB = n
	}
	if hasPct {
		n, ok := pct.AsInt64()
		if !ok || n < 1 || n > 100 {
			return cr, false, fieldErr(names.MemoryPercent, "must be a whole percentage from 1 to 100, got %s", pct.String())
		}
		cr.MemoryPercent = n
	}
	switch {
	case hasCores:
		n, ok := cores.AsInt64()
		if !ok || n < 0 || n > FullCores {
			return cr, false, fieldErr(names.Cores, "must be a whole percentage from 0 to 100, got %s", cores.String())
		}
		cr.Cores = n
	case !hasMem && !hasPct:
		// Only a card count: whole cards.
		cr.Cores = FullCores
	}
	return cr, true, nil
}
