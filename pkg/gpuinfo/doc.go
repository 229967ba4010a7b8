// Package gpuinfo is Tessera's contract: the resource names a pod uses to ask
// for GPU shares, the annotations the node agent and the scheduler write, and
// the decoders and validators for all of them. It is pure Go and makes no API
// calls; docs/contract.md is its user-facing reference.
package gpuinfo

const (
	// Domain is the prefix of every Tessera resource name and annotation.
	Domain = "tessera.io"

	// InventoryAnnotation is the node annotation holding the node's cards,
	// written by the node agent.
	InventoryAnnotation = Domain + "/gpu-inventory"
	// AssignmentAnnotation is the pod annotation holding the cards chosen for
	// each container, written by the scheduler at bind time.
	AssignmentAnnotation = Domain + "/gpu-assignment"

	// ModelAnnotation restricts a pod to cards whose model contains one of the
	// comma-separated values (case-insensitive).
	ModelAnnotation = Domain + "/gpu-model"
	// ModelExcludeAnnotation excludes cards whose model contains one of the
	// comma-separated values (case-insensitive).
	ModelExcludeAnnotation = Domain + "/gpu-model-exclude"
	// TaskPriorityAnnotation sets, for one pod, the in-card task priority of
	// its shared-card containers ("high" or "low"), overriding the one the
	// node agent derives from the pod's priority.
	TaskPriorityAnnotation = Domain + "/gpu-task-priority"
	// IsolationAnnotation asks for hardware isolation: IsolationMIG gives
	// each GPU container a MIG slice of its own, IsolationMIGShared a memory
	// share inside one.
	IsolationAnnotation = Domain + "/gpu-isolation"
	// MIGProfileAnnotation, with IsolationAnnotation, restricts a pod to
	// MIG slices of the named profile, e.g. "3g.40gb".
	MIGProfileAnnotation = Domain + "/gpu-mig-profile"
	// UUIDAnnotation restricts a pod to the listed card UUIDs.
	UUIDAnnotation = Domain + "/gpu-uuid"
	// UUIDExcludeAnnotation excludes the listed card UUIDs.
	UUIDExcludeAnnotation = Domain + "/gpu-uuid-exclude"

	// AgentLeasePrefix starts the name of each node agent's heartbeat Lease,
	// "tessera-agent-<node>", in the agent's namespace.
	AgentLeasePrefix = "tessera-agent-"
	// AgentNotReadyAnnotation, on an agent's Lease, says why the agent cannot
	// enforce assignments now (its NRI plugin is not connected to the
	// container runtime, or it is starting or stopping). The scheduler places
	// no GPU pod on the node while it is set.
	AgentNotReadyAnnotation = Domain + "/agent-not-ready"
	// MaxNotReadyReason bounds how much of that reason the scheduler repeats.
	MaxNotReadyReason = 256
	// AgentMetricsTokenHeader carries a bearer token to an agent's metrics
	// port through the API server's pod proxy, which authenticates its caller
	// by the Authorization header and removes it before forwarding (kubectl
	// tessera top sends a token of the tessera-metrics-reader ServiceAccount
	// here). The agent reads it only when the request has no Authorization
	// header; it is worth no more than the same token there.
	AgentMetricsTokenHeader = "X-Tessera-Authorization"

	// FullCores is the compute share of a whole card, in percent. A container
	// asking for FullCores holds its cards exclusively.
	FullCores = 100
	// MaxCardsPerNode bounds the cards one node may report and one container
	// may ask for.
	MaxCardsPerNode = 64
	// MaxCardMemoryMiB bounds the memory one card may report or one container
	// may ask for on one card (1 TiB).
	MaxCardMemoryMiB = 1 << 20
	// DefaultSplitCount is how many units of the card-count resource
	// (tessera.io/gpu) the node agent's device plugin advertises to kubelet
	// per card by default: kubelet admits pods against cards × split, and
	// the scheduler's NodeResourcesFit counts the same resource.
	DefaultSplitCount = 10
	// MaxAnnotationBytes bounds the size of an inventory or assignment
	// annotation that is decoded at all.
	MaxAnnotationBytes = 64 << 10
)
