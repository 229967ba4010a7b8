// Package v1 holds the versioned (kubescheduler.config.k8s.io/v1) types of
// Tessera's plugin arguments, their defaults and their conversion.
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GPUShareArgs configures the GPUShare plugin.
type GPUShareArgs struct {
	metav1.TypeMeta `json:",inline"`

	// NodePolicy ranks feasible nodes: Binpack (default), Spread or
	// FragmentationAware.
	NodePolicy *string `json:"nodePolicy,omitempty"`
	// GPUPolicy chooses cards on the chosen node: Binpack (default), Spread
	// or FragmentationAware.
	GPUPolicy *string `json:"gpuPolicy,omitempty"`
	// ResourceNames are the container resource names pods ask with; unset
	// names default to Tessera's (tessera.io/gpu, ...).
	ResourceNames *ResourceNames `json:"resourceNames,omitempty"`
	// AgentHeartbeatTimeout is how long a node agent's heartbeat Lease may go
	// unrenewed before its node gets no new GPU pods (default 40s; 0s disables
	// the check). A node with a GPU inventory and no Lease is not reporting either.
	AgentHeartbeatTimeout *metav1.Duration `json:"agentHeartbeatTimeout,omitempty"`
	// AgentNamespace is where the node agents' Leases live (default
	// tessera-system).
	AgentNamespace *string `json:"agentNamespace,omitempty"`
}

// ResourceNames are the container resource names of a GPU request.
type ResourceNames struct {
	GPU           string `json:"gpu,omitempty"`
	Memory        string `json:"memory,omitempty"`
	MemoryPercent string `json:"memoryPercent,omitempty"`
	Cores         string `json:"cores,omitempty"`
}
