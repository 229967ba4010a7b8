// Package v1alpha1 holds the GPUShareResize API (tessera.io/v1alpha1): a
// request to change a running container's GPU share on the cards it holds,
// without moving or restarting it. The CRD is in manifests/base/crds; the
// resize controller in the scheduler binary decides, and the node agent
// applies the limits (docs/resize.md).
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource is the GPUShareResize resource.
var Resource = schema.GroupVersionResource{Group: "tessera.io", Version: "v1alpha1", Resource: "gpushareresizes"}

// Kind is the GPUShareResize kind.
const Kind = "GPUShareResize"

// RightSizeLabel, on a resize that automatic right-sizing created, says
// why: "shrink" or "restore".
const RightSizeLabel = "tessera.io/right-size"

// GPUShareResize asks for a new GPU share for one container of a pod in its
// namespace, on every card the container holds.
type GPUShareResize struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GPUShareResizeSpec   `json:"spec"`
	Status            GPUShareResizeStatus `json:"status,omitempty"`
}

// GPUShareResizeSpec names the container and its new share per card.
type GPUShareResizeSpec struct {
	// PodName is the pod, in the resize's namespace.
	PodName string `json:"podName"`
	// Container is the container, by name.
	Container string `json:"container"`
	// Memory is the new memory share on each of its cards; unset keeps it.
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Cores is the new compute share of each card in percent (1-99); unset
	// keeps it.
	Cores *int64 `json:"cores,omitempty"`
}

// GPUShareResizeStatus is written by Tessera only: the controller's
// conditions and the share it committed, the node agent's report of the
// limits it wrote.
type GPUShareResizeStatus struct {
	// ObservedGeneration is the spec generation the controller's conditions
	// are about.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// NodeName is the node the pod runs on: that node's agent alone may
	// report on the resize.
	NodeName string `json:"nodeName,omitempty"`
	// From is the container's share per card when the resize was taken up.
	From []CardShare `json:"from,omitempty"`
	// To is the share per card the resize asks for.
	To []CardShare `json:"to,omitempty"`
	// Conditions are Pending, Applied, Refused (the controller's) and
	// LimitsWritten (the node agent's).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CardShare is a container's share of one card.
type CardShare struct {
	// Index is the card's index on the node.
	Index int `json:"index"`
	// MemoryMiB is the memory share in MiB.
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the compute share in percent.
	Cores int64 `json:"cores"`
}

// Condition types.
const (
	// ConditionPending is True while the resize waits: for the node agent
	// to lower the limits of a shrink, or to raise those of a committed grow.
	ConditionPending = "Pending"
	// ConditionApplied is True once the ledger and the limits hold the new
	// share.
	ConditionApplied = "Applied"
	// ConditionRefused is True when the resize will not be applied; its
	// reason and message say why.
	ConditionRefused = "Refused"
	// ConditionLimitsWritten is the node agent's: True once it wrote the To
	// limits into every shared region of the container and read them back
	// (for a shrink, after checking the container uses less).
	ConditionLimitsWritten = "LimitsWritten"
)

// ReasonWaitingForNodeAgent is the Pending condition's reason while the
// resize waits for the node agent of status.nodeName to write the To limits
// and report LimitsWritten: the agent acts on a resize only then.
const ReasonWaitingForNodeAgent = "WaitingForNodeAgent"

// Decided reports whether the resize was applied or refused.
func (r *GPUShareResize) Decided() bool {
	return meta.IsStatusConditionTrue(r.Status.Conditions, ConditionApplied) ||
		meta.IsStatusConditionTrue(r.Status.Conditions, ConditionRefused)
}

// WaitsForNodeAgent reports whether the resize waits for the node agent's
// report.
func (r *GPUShareResize) WaitsForNodeAgent() bool {
	c := meta.FindStatusCondition(r.Status.Conditions, ConditionPending)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonWaitingForNodeAgent
}

// Compare reports whether to asks more (grow) or less (shrink) than from of
// some card's memory or compute, card by card.
func Compare(from, to []CardShare) (grow, shrink bool) {
	for i := range min(len(from), len(to)) {
		grow = grow || to[i].MemoryMiB > from[i].MemoryMiB || to[i].Cores > from[i].Cores
		shrink = shrink || to[i].MemoryMiB < from[i].MemoryMiB || to[i].Cores < from[i].Cores
	}
	return grow, shrink
}

// ShareOf returns the share for the card with index in shares.
func ShareOf(shares []CardShare, index int) (CardShare, bool) {
	for _, s := range shares {
		if s.Index == index {
			return s, true
		}
	}
	return CardShare{}, false
}

// Unstructured is the resize as the dynamic client sends it.
func (r *GPUShareResize) Unstructured() (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(r)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(Resource.GroupVersion().String())
	u.SetKind(Kind)
	return u, nil
}
