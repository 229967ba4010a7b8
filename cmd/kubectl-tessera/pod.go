package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/fleet"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func newPodCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pod NAME",
		Short: "Show a pod's GPU request, its cards, or why it is pending, node by node",
		Long: `Show a pod's GPU request and, once it is bound, the cards of each container.
For a pending pod, show the scheduler's message and, for every GPU node, the
answer of the scheduler's GPU filter: the node's agent not reporting or not
ready, the reason the pod does not fit (computed with the scheduler's own
allocator and binpack policy), or the cards it would get.`,
		Example: `  kubectl tessera pod my-inference -n ml`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ns, err := g.clientIn()
			if err != nil {
				return err
			}
			return runPod(cmd.Context(), g, client, ns, args[0])
		},
	}
}

func runPod(ctx context.Context, g *globals, client kubernetes.Interface, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %q not found in namespace %q", name, ns)
	} else if err != nil {
		return fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	names, err := schedulerResourceNames(ctx, client, g.tesseraNamespace)
	if err != nil {
		warn(g.streams.ErrOut, []error{fmt.Errorf("reading pods with Tessera's own resource names: %w", err)})
		names = gpuinfo.DefaultResourceNames()
	}
	req, err := gpuinfo.ParsePodRequest(pod, names)
	if err != nil {
		return fmt.Errorf("pod %s/%s: invalid GPU request: %w", ns, name, err)
	}
	if req == nil {
		return fmt.Errorf("pod %s/%s asks for no GPUs: none of its containers has %s, %s, %s or %s in its limits or requests",
			ns, name, names.GPU, names.Memory, names.MemoryPercent, names.Cores)
	}
	out := PodStatus{APIVersion: OutputAPIVersion, Kind: "GPUPodStatus", Namespace: ns, Name: name, Node: pod.Spec.NodeName,
		Selector: req.Selector.String(), Scheduled: scheduledMessage(pod)}
	for _, c := range req.Containers {
		out.Request = append(out.Request, ContainerRequest{Container: c.Name, Kind: kindName(c.Kind), Cards: c.Count,
			MemoryMiB: c.MemoryMiB, MemoryPercent: c.MemoryPercent, Cores: c.Cores})
	}
	var assignmentErr error
	if raw, ok := pod.Annotations[gpuinfo.AssignmentAnnotation]; ok && pod.Spec.NodeName != "" {
		a, err := gpuinfo.DecodeAssignment(raw)
		if err != nil {
			assignmentErr = fmt.Errorf("pod %s/%s: %w", ns, name, err)
		} else {
			out.Assignment = assignedCards(pod, a)
		}
	}
	finished := pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
	if pod.Spec.NodeName == "" && !finished {
		out.Nominated = pod.Status.NominatedNodeName
		out.Gates = gates(pod)
		var problems []error
		if out.Victims, err = victims(ctx, client, pod); err != nil {
			problems = append(problems, err)
		}
		against, err := reservationsAgainst(ctx, g, pod)
		if err != nil {
			problems = append(problems, err)
		}
		for _, r := range against {
			out.Reservations = append(out.Reservations, r.text)
		}
		warn(g.streams.ErrOut, problems)
		if out.Nodes, err = fits(ctx, g, client, req, against); err != nil {
			return err
		}
	}
	if pod.Spec.NodeName != "" {
		// Without the CRD, or the right to list resizes, there are none to show.
		out.Resizes, _ = podResizes(ctx, g, ns, name)
	}
	switch quiet, on, err := gpuinfo.QuietPeriod(pod); {
	case err != nil:
		out.RightSize = "not right-sized: " + err.Error()
	case on:
		out.RightSize = "on: after " + quiet.String() + " without a higher peak, the memory share shrinks to the peak plus a margin; restored near the limit"
	}
	if assignmentErr != nil {
		warn(g.streams.ErrOut, []error{assignmentErr})
	}
	if g.output == outputJSON || g.output == outputYAML {
		return printStructured(g.streams.Out, g.output, out)
	}
	return printPod(g.streams.Out, pod, out, assignmentErr)
}

// fits answers, for every GPU node, what the scheduler's GPU filter answers
// for req now, with the cards the reservations against the pod keep free.
func fits(ctx context.Context, g *globals, client kubernetes.Interface, req *gpuinfo.PodRequest, against []keptOut) ([]NodeFit, error) {
	snapshot, err := fleet.Load(ctx, client)
	if err != nil {
		return nil, err
	}
	blocked := agentsBlocking(ctx, g, client)
	selector := req.Selector.String()
	var result []NodeFit
	for _, n := range snapshot.Nodes {
		f := NodeFit{Node: n.Name}
		switch {
		case blocked[n.Name].message != "":
			f.Message = blocked[n.Name].message
		case n.Err != nil:
			f.Message = "GPU inventory invalid: " + n.Err.Error()
		default:
			a := &gpuinfo.Assignment{Containers: map[string][]gpuinfo.CardAssignment{}}
			reserved, by := reservedOn(against, n.Labels)
			o := allocator.Place(n.Cards, n.Used, nil, req, allocator.Strategy{Policy: allocator.Binpack, Reserve: reserved}, a)
			if !o.Fits {
				f.Message = o.Failure.Message(selector) + figures(&o.Failure)
				if o.Failure.Kind == allocator.Reserved {
					f.Message += " (GPUReservation " + strings.Join(by, ", ") + ")"
				}
				break
			}
			f.Fits, f.Cards = true, map[string][]int{}
			var parts []string
			for _, c := range req.Containers {
				var indices []string
				for _, e := range a.Containers[c.Name] {
					f.Cards[c.Name] = append(f.Cards[c.Name], e.Index)
					index := strconv.Itoa(e.Index)
					if e.MIG != nil {
						index += "/" + entrySlice(e)
					}
					indices = append(indices, index)
				}
				part := strings.Join(indices, ",")
				if len(req.Containers) > 1 {
					part = c.Name + ": " + part
				}
				parts = append(parts, part)
			}
			f.Message = "fits on cards " + strings.Join(parts, "; ")
		}
		result = append(result, f)
	}
	return result, nil
}

// figures adds the node's own numbers to a capacity failure's message, as
// the scheduler's PostFilter summary gives them for the fleet: how many
// cards had room, or the most any card had free.
func figures(f *allocator.Failure) string {
	c := f.Container
	switch {
	case f.Kind == allocator.TooFewCards:
		return fmt.Sprintf(" (%d have room)", f.Fit)
	case f.Kind != allocator.NoCapacity || c == nil || c.Exclusive():
		return ""
	case c.MemoryMiB > 0 && f.MostFree.MemoryMiB < c.MemoryMiB:
		return fmt.Sprintf(" (most free: %d MiB)", f.MostFree.MemoryMiB)
	case f.MostFree.Cores < c.Cores:
		return fmt.Sprintf(" (most free: %d%% compute)", f.MostFree.Cores)
	}
	return ""
}

// assignedCards lists the assignment's cards by container.
func assignedCards(pod *v1.Pod, a *gpuinfo.Assignment) map[string][]AssignedCard {
	out := map[string][]AssignedCard{}
	for name, cards := range a.Containers {
		for _, c := range cards {
			out[name] = append(out[name], AssignedCard{Card: c.Index, UUID: c.UUID, MemoryMiB: c.MemoryMiB, Cores: c.Cores})
		}
	}
	return out
}

func printPod(w io.Writer, pod *v1.Pod, s PodStatus, assignmentErr error) error {
	fmt.Fprintf(w, "Pod:         %s/%s\n", s.Namespace, s.Name)
	status := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		status = "Terminating"
	}
	fmt.Fprintf(w, "Status:      %s\n", status)
	for _, g := range s.Gates {
		fmt.Fprintf(w, "Gated:       %s\n", g)
	}
	if s.Node != "" {
		fmt.Fprintf(w, "Node:        %s\n", s.Node)
	} else if s.Nominated != "" {
		fmt.Fprintf(w, "Nominated:   %s (preemption under way)\n", s.Nominated)
		if len(s.Victims) > 0 {
			fmt.Fprintf(w, "Victims:     %s (terminating, evicted by the scheduler for this pod or another preemptor on the node)\n", strings.Join(s.Victims, ", "))
		}
	}
	for _, r := range s.Reservations {
		fmt.Fprintf(w, "Reserved:    %s; not this pod\n", r)
	}
	if s.Selector != "" {
		fmt.Fprintf(w, "Selector:    %s\n", s.Selector)
	}
	fmt.Fprintln(w, "Request:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  CONTAINER\tKIND\tCARDS\tMEMORY PER CARD\tCORES PER CARD")
	for _, c := range s.Request {
		memory := "whole card"
		switch {
		case c.MemoryMiB > 0:
			memory = fmt.Sprintf("%d MiB", c.MemoryMiB)
		case c.MemoryPercent > 0:
			memory = fmt.Sprintf("%d%%", c.MemoryPercent)
		}
		cores := fmt.Sprintf("%d%%", c.Cores)
		if c.Cores >= gpuinfo.FullCores {
			cores += " (exclusive)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", c.Container, c.Kind, c.Cards, memory, cores)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case assignmentErr != nil:
		fmt.Fprintf(w, "Assignment:  invalid: %v\n", assignmentErr)
	case s.Node != "" && s.Assignment == nil:
		fmt.Fprintf(w, "Assignment:  none (bound without %s: not placed by Tessera's scheduler)\n", gpuinfo.AssignmentAnnotation)
	case s.Assignment != nil:
		fmt.Fprintln(w, "Assignment:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  CONTAINER\tGPU\tUUID\tMEMORY (MiB)\tCORES")
		for _, c := range gpuinfo.ContainerOrder(pod) {
			for _, card := range s.Assignment[c.Name] {
				fmt.Fprintf(tw, "  %s\t%d\t%s\t%d\t%d%%\n", c.Name, card.Card, card.UUID, card.MemoryMiB, card.Cores)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if s.RightSize != "" {
		fmt.Fprintf(w, "Right-size:  %s\n", s.RightSize)
	}
	for _, r := range s.Resizes {
		fmt.Fprintf(w, "Resize:      %s\n", r)
	}
	if s.Scheduled != "" {
		fmt.Fprintf(w, "Scheduler:   %s\n", s.Scheduled)
	}
	if s.Node == "" && s.Nodes != nil {
		fmt.Fprintln(w, "GPU nodes now (the scheduler's GPU filter, binpack):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, f := range s.Nodes {
			fmt.Fprintf(tw, "  %s\t%s\n", f.Node, f.Message)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	} else if s.Node == "" && pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
		fmt.Fprintln(w, "GPU nodes now: none (no node carries a GPU inventory)")
	}
	return nil
}

// kueueAdmissionGate is the scheduling gate Kueue holds a pod with until
// its workload is admitted (docs/queues.md).
const kueueAdmissionGate = "kueue.x-k8s.io/admission"

// gates are the pod's scheduling gates, each with what it waits for.
func gates(pod *v1.Pod) []string {
	var out []string
	for _, g := range pod.Spec.SchedulingGates {
		what := "no scheduler considers the pod until it is removed"
		if g.Name == kueueAdmissionGate {
			what = "waiting for Kueue to admit it (its queue's quota), not for cards"
		}
		out = append(out, g.Name+": "+what)
	}
	return out
}

// scheduledMessage is the message of the pod's PodScheduled condition.
func scheduledMessage(pod *v1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled {
			return c.Message
		}
	}
	return ""
}

func kindName(k gpuinfo.ContainerKind) string {
	switch k {
	case gpuinfo.InitContainer:
		return "init"
	case gpuinfo.SidecarContainer:
		return "sidecar"
	}
	return "app"
}
