package main

import (
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// OutputAPIVersion is the apiVersion of the structured output (-o json|yaml).
const OutputAPIVersion = "tessera.io/v1alpha1"

// CardList is `nodes -o json|yaml`: every GPU card of the cluster.
type CardList struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Items      []CardStatus `json:"items"`
}

// CardStatus is one card, its allocation and its holders.
type CardStatus struct {
	// Node is the card's node.
	Node string `json:"node"`
	// Card is the card's index on the node.
	Card int `json:"card"`
	// UUID is the card's UUID, or a MIG slice's MIG device UUID.
	UUID string `json:"uuid"`
	// Slice, for a MIG slice of the card, is its profile and first memory
	// slot, e.g. "3g.40gb@4"; the card's own entry comes first.
	Slice string `json:"slice,omitempty"`
	// Model is the card's product name.
	Model string `json:"model"`
	// Healthy is false for a card (or slice) that gets no new work.
	Healthy bool `json:"healthy"`
	// MIG reports that the card is in MIG mode: its slices, listed after
	// it, take its pods.
	MIG bool `json:"mig,omitempty"`
	// Claims reports that the card is a DRA device, held by resource
	// claims rather than by extended-resource assignments.
	Claims bool `json:"claims,omitempty"`
	// MemoryMiB is the card's memory.
	MemoryMiB int64 `json:"memoryMiB"`
	// MemoryAllocatedMiB is the memory the pods on the card hold.
	MemoryAllocatedMiB int64 `json:"memoryAllocatedMiB"`
	// CoresAllocated is the compute share, %, the pods on the card hold.
	CoresAllocated int64 `json:"coresAllocated"`
	// Pods are the pods holding the card, as namespace/name.
	Pods []string `json:"pods"`
	// Agent is why the scheduler places no new pod on the card's node
	// because of its node agent; empty when it does not.
	Agent string `json:"agent,omitempty"`
}

// PodStatus is `pod -o json|yaml`.
type PodStatus struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Namespace and Name name the pod.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Node is the pod's node, empty while it is pending.
	Node string `json:"node,omitempty"`
	// Request is the pod's GPU request, container by container.
	Request []ContainerRequest `json:"request"`
	// Selector describes the pod's card selector annotations, if any.
	Selector string `json:"selector,omitempty"`
	// Assignment is the cards of each container, once the pod is bound.
	Assignment map[string][]AssignedCard `json:"assignment,omitempty"`
	// Scheduled is the message of the pod's PodScheduled condition.
	Scheduled string `json:"scheduled,omitempty"`
	// Gates are, for a pending pod, its scheduling gates, each with what it
	// waits for: no scheduler considers the pod until they are removed.
	Gates []string `json:"gates,omitempty"`
	// Nominated is, for a pending pod, the node preemption made room on.
	Nominated string `json:"nominated,omitempty"`
	// Victims are, for a nominated pod, the lower-priority pods the
	// scheduler is evicting on that node (namespace/name), for it or for
	// another preemptor there.
	Victims []string `json:"victims,omitempty"`
	// Reservations are, for a pending pod, the GPUReservations that keep
	// cards from it.
	Reservations []string `json:"reservations,omitempty"`
	// Nodes is, for a pending pod, each GPU node's answer.
	Nodes []NodeFit `json:"nodes,omitempty"`
	// Resizes are the pod's GPUShareResizes, oldest first: what each asks
	// and where it stands.
	Resizes []string `json:"resizes,omitempty"`
	// RightSize says whether the pod opted in to automatic right-sizing,
	// with its quiet period (or why its annotation is invalid).
	RightSize string `json:"rightSize,omitempty"`
}

// ContainerRequest is one container's GPU request.
type ContainerRequest struct {
	Container string `json:"container"`
	// Kind is app, init or sidecar.
	Kind  string `json:"kind"`
	Cards int    `json:"cards"`
	// MemoryMiB or MemoryPercent is the memory on each card; both are 0
	// when the container asks for whole cards' memory.
	MemoryMiB     int64 `json:"memoryMiB,omitempty"`
	MemoryPercent int64 `json:"memoryPercent,omitempty"`
	// Cores is the compute share of each card, %; 100 is exclusive.
	Cores int64 `json:"cores"`
}

// AssignedCard is one card given to a container.
type AssignedCard struct {
	Card      int    `json:"card"`
	UUID      string `json:"uuid"`
	MemoryMiB int64  `json:"memoryMiB"`
	Cores     int64  `json:"cores"`
}

// NodeFit is whether a pending pod fits on one GPU node.
type NodeFit struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Cards are the cards the pod would get, by container, when it fits.
	Cards map[string][]int `json:"cards,omitempty"`
	// Message is the scheduler's reason when it does not fit, or the
	// cards it would get.
	Message string `json:"message"`
}

// ContainerUsageList is `top -o json|yaml`.
type ContainerUsageList struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Items      []ContainerUsage `json:"items"`
	// Unavailable says why memory in use is missing, when it is.
	Unavailable []string `json:"unavailable,omitempty"`
}

// ContainerUsage is one container on one card.
type ContainerUsage struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	Node      string `json:"node"`
	Card      int    `json:"card"`
	UUID      string `json:"uuid"`
	// Slice, when the container has a MIG slice of the card, is its
	// profile and first memory slot, e.g. "1g.10gb@6".
	Slice string `json:"slice,omitempty"`
	// MemoryMiB and Cores are what the assignment gives the container.
	MemoryMiB int64 `json:"memoryMiB"`
	Cores     int64 `json:"cores"`
	// MemoryUsedMiB is what the node agent measures the container using;
	// absent when unknown.
	MemoryUsedMiB *float64 `json:"memoryUsedMiB,omitempty"`
}

// printStructured writes v as JSON or YAML.
func printStructured(w io.Writer, format string, v any) error {
	switch format {
	case outputJSON:
		b, err := json.MarshalIndent(v, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case outputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("unknown structured output %q", format)
}

// warn writes the snapshot's problems, one a line.
func warn(w io.Writer, problems []error) {
	for _, p := range problems {
		fmt.Fprintln(w, "warning:", p)
	}
}
