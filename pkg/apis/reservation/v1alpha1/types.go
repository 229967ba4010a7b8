// Package v1alpha1 holds the GPUReservation API (tessera.io/v1alpha1): GPU
// capacity an operator keeps back for critical pods. The CRD is in
// manifests/base/crds; the scheduler plugin reads these objects.
package v1alpha1

import (
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// Resource is the GPUReservation resource.
var Resource = schema.GroupVersionResource{Group: "tessera.io", Version: "v1alpha1", Resource: "gpureservations"}

// GPUReservation keeps whole cards entirely free on the nodes it selects,
// for the pods it names: other pods see those cards as taken. Critical pods
// then start at once, without evicting anyone.
type GPUReservation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GPUReservationSpec `json:"spec"`
}

// GPUReservationSpec says where, how much and for whom.
type GPUReservationSpec struct {
	// NodeSelector selects the nodes; empty selects every GPU node.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Cards is how many whole cards to keep entirely free on each selected
	// node (1-64).
	Cards int32 `json:"cards"`
	// For names the pods that may use the reserved cards.
	For ReservedFor `json:"for"`
}

// ReservedFor names pods by priority, namespace, or both (either suffices).
type ReservedFor struct {
	// MinPriority admits pods whose priority is at least this.
	MinPriority *int32 `json:"minPriority,omitempty"`
	// Namespaces admits pods in these namespaces.
	Namespaces []string `json:"namespaces,omitempty"`
}

// Admits reports whether pod may use the reserved cards: its priority is at
// least MinPriority, or its namespace is listed.
func (f ReservedFor) Admits(pod *v1.Pod) bool {
	if f.MinPriority != nil && corev1helpers.PodPriority(pod) >= *f.MinPriority {
		return true
	}
	return slices.Contains(f.Namespaces, pod.Namespace)
}

// String names the pods admitted: "priority >= 1000 or namespaces a, b";
// empty when it names none.
func (f ReservedFor) String() string {
	var whom []string
	if f.MinPriority != nil {
		whom = append(whom, "priority >= "+strconv.Itoa(int(*f.MinPriority)))
	}
	if len(f.Namespaces) > 0 {
		whom = append(whom, "namespaces "+strings.Join(f.Namespaces, ", "))
	}
	return strings.Join(whom, " or ")
}

// Nodes is the selector of the nodes it keeps cards on: every node when
// NodeSelector is empty.
func (s GPUReservationSpec) Nodes() (labels.Selector, error) {
	if s.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s.NodeSelector)
}
