// Package manifests embeds Tessera's install manifests — the kustomize base,
// its overlays and the example pods — so that the test suite, the demo and
// the trace simulator run exactly what an operator applies with
// `kubectl apply -k manifests`.
package manifests

import "embed"

// FS holds the kustomize base (kustomization.yaml and the directories it
// names), the overlays and the examples, at their paths in this directory.
//
//go:embed kustomization.yaml base overlays examples monitoring
var FS embed.FS

// SchedulerConfig is the KubeSchedulerConfiguration the base ships, the
// content of its generated ConfigMap.
//
//go:embed base/scheduler/scheduler-config.yaml
var SchedulerConfig []byte

// Names of the objects the base creates that code and tests refer to.
const (
	// Namespace holds both components, their Leases and the agents' Leases.
	Namespace = "tessera-system"
	// SchedulerServiceAccount is the scheduler's identity.
	SchedulerServiceAccount = "tessera-scheduler"
	// AgentServiceAccount is the node agents' identity.
	AgentServiceAccount = "tessera-node-agent"
	// SchedulerConfigMap is the generated ConfigMap's name before kustomize
	// appends its content hash.
	SchedulerConfigMap = "tessera-scheduler-config"
	// SchedulerConfigKey is the ConfigMap's key holding the configuration.
	SchedulerConfigKey = "scheduler-config.yaml"
	// SchedulerFeatureGates are the feature gates the scheduler's Deployment
	// sets. Asynchronous preemption is off: in kube-scheduler 1.37 a
	// preemptor can wait in the unschedulable pool for the 5-minute flush
	// when its victims' deletion is consumed by an attempt in flight
	// (kubernetes/kubernetes#141694); preempting in the scheduling cycle
	// cannot lose that event.
	SchedulerFeatureGates = "SchedulerAsyncPreemption=false"
	// HighPriorityLabel, set to HighPriorityAllowed on a namespace by the
	// operator, lets its pods and claims take high priority (the admission
	// policy tessera-high-priority).
	HighPriorityLabel   = "tessera.io/high-priority"
	HighPriorityAllowed = "allowed"
)
