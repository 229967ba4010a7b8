package cluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/fleet"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// WriteTable prints, from the API alone, every GPU node's cards with their
// memory and compute in use and the pods holding them, then the pods still
// pending and why, the preemptions that happened, and bound pods without
// GPUs.
func WriteTable(ctx context.Context, client kubernetes.Interface, w io.Writer) error {
	snapshot, err := fleet.Load(ctx, client)
	if err != nil {
		return err
	}
	var pending, plain []string
	for i := range snapshot.Pods {
		p := &snapshot.Pods[i]
		key := p.Namespace + "/" + p.Name
		raw, hasGPU := p.Annotations[gpuinfo.AssignmentAnnotation]
		switch {
		case p.Spec.NodeName == "":
			pending = append(pending, key+": "+unschedulableMessage(p))
		case !hasGPU && (len(p.Spec.ResourceClaims) == 0 || snapshot.Node(p.Spec.NodeName) == nil):
			plain = append(plain, key+" on "+p.Spec.NodeName)
		case !hasGPU: // its GPUs are claims, shown with their cards
		default:
			if _, err := gpuinfo.DecodeAssignment(raw); err != nil {
				pending = append(pending, key+": invalid assignment: "+err.Error())
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tMEMORY (MiB)\tCOMPUTE\tPODS")
	for _, n := range snapshot.Nodes {
		for i, c := range n.Cards {
			model := n.Model(c)
			if !c.Healthy {
				model += " (unhealthy)"
			}
			used := n.Used[i]
			if c.OnlyPossible(used) {
				continue
			}
			holders := make([]string, len(n.Holders[i]))
			for j, h := range n.Holders[i] {
				holders[j] = h.Name
			}
			gpu := strconv.Itoa(c.Index)
			if c.Slice != nil {
				gpu += "/" + c.Slice.Name()
			}
			if c.MIG {
				// Its slices, on the next rows, hold its pods.
				fmt.Fprintf(tw, "%s\t%s\t%s (MIG mode)\t-\t-\t\n", n.Name, gpu, model)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s %6d/%-6d\t%s %3d%%\t%s\n", n.Name, gpu, model,
				fleet.Bar(used.MemoryMiB, c.Capacity.MemoryMiB), used.MemoryMiB, c.Capacity.MemoryMiB,
				fleet.Bar(used.Cores, c.Capacity.Cores), used.Cores, strings.Join(holders, ", "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	sort.Strings(pending)
	sort.Strings(plain)
	if len(pending) > 0 {
		fmt.Fprintf(w, "\nPending:\n  %s\n", strings.Join(pending, "\n  "))
	}
	preemptions, err := Preemptions(ctx, client, metav1.NamespaceAll)
	if err != nil {
		return err
	}
	if len(preemptions) > 0 {
		fmt.Fprintln(w, "\nPreempted:")
		for _, p := range preemptions {
			fmt.Fprintf(w, "  %s for %s on %s\n", p.Victim, p.Preemptor, p.Node)
		}
	}
	if len(plain) > 0 {
		fmt.Fprintf(w, "\nWithout GPUs:\n  %s\n", strings.Join(plain, "\n  "))
	}
	return nil
}

func unschedulableMessage(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message
		}
	}
	return "not scheduled yet"
}
