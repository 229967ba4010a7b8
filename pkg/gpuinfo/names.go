package gpuinfo

import (
	v1 "k8s.io/api/core/v1"
)

// ResourceNames are the container resource names a pod uses to ask for GPUs.
// They are configurable so that pod specs written for another GPU-sharing
// scheduler keep working.
type ResourceNames struct {
	// GPU is the number of cards for the container.
	GPU v1.ResourceName
	// Memory is the memory in MiB the container gets on each card.
	Memory v1.ResourceName
	// MemoryPercent is the share, 1-100, of each card's memory.
	MemoryPercent v1.ResourceName
	// Cores is the share, 0-100, of each card's compute.
	Cores v1.ResourceName
}

// DefaultResourceNames returns Tessera's own resource names.
func DefaultResourceNames() ResourceNames {
	return ResourceNames{
		GPU:           Domain + "/gpu",
		Memory:        Domain + "/gpu-memory",
		MemoryPercent: Domain + "/gpu-memory-percent",
		Cores:         Domain + "/gpu-cores",
	}
}

// HAMiResourceNames returns the names HAMi uses, for clusters migrating from it.
func HAMiResourceNames() ResourceNames {
	return ResourceNames{
		GPU:           "nvidia.com/gpu",
		Memory:        "nvidia.com/gpumem",
		MemoryPercent: "nvidia.com/gpumem-percentage",
		Cores:         "nvidia.com/gpucores",
	}
}
