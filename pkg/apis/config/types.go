// Package config holds the internal types of Tessera's scheduler plugin
// arguments, registered in kube-scheduler's configuration scheme.
package config

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Policy names a placement policy.
type Policy string

const (
	// PolicyBinpack packs work onto nodes and cards already in use.
	PolicyBinpack Policy = "Binpack"
	// PolicySpread prefers the least used nodes and cards.
	PolicySpread Policy = "Spread"
	// PolicyFragmentationAware prefers the placement that leaves the least
	// GPU unusable by the workload the scheduler has been seeing.
	PolicyFragmentationAware Policy = "FragmentationAware"
)

// GPUShareArgs configures the GPUShare plugin.
type GPUShareArgs struct {
	metav1.TypeMeta

	// NodePolicy ranks feasible nodes.
	NodePolicy Policy
	// GPUPolicy chooses cards on the chosen node.
	GPUPolicy Policy
	// ResourceNames are the container resource names pods ask with.
	ResourceNames ResourceNames
	// AgentHeartbeatTimeout is how long a node agent's heartbeat Lease may go
	// unrenewed before its node gets no new GPU pods; 0 disables the check.
	AgentHeartbeatTimeout metav1.Duration
	// AgentNamespace is where the node agents' Leases live.
	AgentNamespace string
}

// ResourceNames are the container resource names of a GPU request.
type ResourceNames struct {
	GPU           string
	Memory        string
	MemoryPercent string
	Cores         string
}

// Contract returns the names as the contract package types them.
func (n ResourceNames) Contract() gpuinfo.ResourceNames {
	return gpuinfo.ResourceNames{
		GPU:           v1.ResourceName(n.GPU),
		Memory:        v1.ResourceName(n.Memory),
		MemoryPercent: v1.ResourceName(n.MemoryPercent),
		Cores:         v1.ResourceName(n.Cores),
	}
}
