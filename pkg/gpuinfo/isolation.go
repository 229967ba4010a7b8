package gpuinfo

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Isolation is how a pod's GPU containers are fenced from other pods'.
type Isolation uint8

const (
	// SharedCard, the default: whole cards or shares of them, limited by
	// HAMi-core; cards in MIG mode are not used.
	SharedCard Isolation = iota
	// OwnMIGSlice gives each GPU container a MIG slice of its own: the
	// smallest free one that holds its memory request.
	OwnMIGSlice
	// MIGSliceShare gives each GPU container a memory share inside a MIG slice,
	// limited by HAMi-core; compute inside a slice is not limited.
	MIGSliceShare
)

// Values of IsolationAnnotation.
const (
	IsolationMIG       = "mig"
	IsolationMIGShared = "mig-shared"
)

// HAMiModeAnnotation is HAMi's pod annotation choosing between its shares
// ("hami-core") and MIG slices ("mig"); Tessera reads it as
// IsolationAnnotation's "" and "mig", so HAMi's pod specs keep working.
const HAMiModeAnnotation = "nvidia.com/vgpu-mode"

// MIG reports whether the request is for MIG slices or shares of them.
func (i Isolation) MIG() bool { return i != SharedCard }

// parseIsolation reads the pod's IsolationAnnotation and checks its GPU
// containers against it: a MIG container gets one slice (a process sees one
// MIG device), in MiB rather than a percentage; a slice of one's own is held
// whole, and a share inside one limits memory only.
func parseIsolation(annotations map[string]string, containers []ContainerRequest, names ResourceNames) (iso Isolation, profile string, err error) {
	iso, value, err := isolationAnnotations(annotations)
	if err != nil {
		return 0, "", err
	}
	profile, hasProfile := annotations[MIGProfileAnnotation]
	switch {
	case hasProfile && iso != OwnMIGSlice && iso != MIGSliceShare:
		return 0, "", fmt.Errorf("annotation %s: needs %s: %s or %s", MIGProfileAnnotation, IsolationAnnotation, IsolationMIG, IsolationMIGShared)
	case hasProfile && (profile == "" || len(profile) > maxMIGProfileName || strings.ContainsAny(profile, " ,/@")):
		return 0, "", fmt.Errorf("annotation %s: %q is not a MIG profile name such as 1g.10gb", MIGProfileAnnotation, truncated(profile))
	case iso == SharedCard:
		return SharedCard, "", nil
	}
	for i := range containers {
		c := &containers[i]
		fieldErr := func(name v1.ResourceName, format string, args ...any) error {
			return fmt.Errorf("container %q: resource %s: %s (%s)", c.Name, name, fmt.Sprintf(format, args...), value)
		}
		switch {
		case c.Count != 1:
			return 0, "", fieldErr(names.GPU, "a container gets one MIG slice (a CUDA process sees one), got %d", c.Count)
		case c.MemoryPercent > 0:
			return 0, "", fieldErr(names.MemoryPercent, "a MIG request gives its memory in MiB (%s)", names.Memory)
		case iso == MIGSliceShare && c.MemoryMiB == 0:
			return 0, "", fieldErr(names.Memory, "a share inside a MIG slice needs its memory in MiB")
		case iso == MIGSliceShare && c.Cores > 0:
			return 0, "", fieldErr(names.Cores, "compute inside a MIG slice cannot be limited; leave it out")
		case iso == OwnMIGSlice && c.Cores > 0 && c.Cores < FullCores:
			return 0, "", fieldErr(names.Cores, "a MIG slice is held whole; leave it out or give %d", FullCores)
		}
		if iso == OwnMIGSlice {
			c.Cores = FullCores
		}
	}
	return iso, profile, nil
}

// isolationAnnotations reads IsolationAnnotation, or HAMi's
// HAMiModeAnnotation where it is absent; value describes the one read, for
// messages.
func isolationAnnotations(annotations map[string]string) (iso Isolation, value string, err error) {
	if v, ok := annotations[IsolationAnnotation]; ok {
		value = "annotation " + IsolationAnnotation + ": " + truncated(v)
		switch v {
		case IsolationMIG:
			return OwnMIGSlice, value, nil
		case IsolationMIGShared:
			return MIGSliceShare, value, nil
		}
		return 0, "", fmt.Errorf("annotation %s: must be %q or %q, got %q", IsolationAnnotation, IsolationMIG, IsolationMIGShared, truncated(v))
	}
	v, ok := annotations[HAMiModeAnnotation]
	value = "annotation " + HAMiModeAnnotation + ": " + truncated(v)
	switch {
	case !ok || v == "hami-core":
		return SharedCard, "", nil
	case v == IsolationMIG:
		return OwnMIGSlice, value, nil
	}
	return 0, "", fmt.Errorf("annotation %s: must be \"hami-core\" or \"mig\" (Tessera has no MPS), got %q", HAMiModeAnnotation, truncated(v))
}

// truncated cuts an annotation value quoted in a message to 64 bytes.
func truncated(v string) string {
	if len(v) > 64 {
		return v[:64] + "..."
	}
	return v
}
