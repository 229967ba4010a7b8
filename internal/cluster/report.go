package cluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// barWidth is the width of the usage bars in WriteTable.
const barWidth = 16

// WriteTable prints, from the API alone, every GPU node's cards with their
// memory and compute in use and the pods holding them, then the pods still
// pending and why, the preemptions that happened, and bound pods without
// GPUs.
func WriteTable(ctx context.Context, client kubernetes.Interface, w io.Writer) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	l := ledger.New()
	for _, n := range nodes.Items {
		raw, ok := n.Annotations[gpuinfo.InventoryAnnotation]
		_, _ = l.SetInventory(n.Name, n.ResourceVersion, raw, ok)
	}
	holders := map[string][]string{} // card UUID -> pods
	var pending, plain []string
	for i := range pods.Items {
		p := &pods.Items[i]
		key := p.Namespace + "/" + p.Name
		raw, hasGPU := p.Annotations[gpuinfo.AssignmentAnnotation]
		switch {
		case p.Spec.NodeName == "":
			pending = append(pending, key+": "+unschedulableMessage(p))
		case !hasGPU:
			plain = append(plain, key+" on "+p.Spec.NodeName)
		default:
			a, err := gpuinfo.DecodeAssignment(raw)
			if err != nil {
				pending = append(pending, key+": invalid assignment: "+err.Error())
				continue
			}
			l.AddPod(p.UID, p.Spec.NodeName, gpuinfo.ContainerOrder(p), a, false)
			for _, cards := range a.Containers {
				for _, c := range cards {
					holders[c.UUID] = appendOnce(holders[c.UUID], p.Name)
				}
			}
		}
	}
	snapshot := l.Snapshot()
	names := make([]string, 0, len(snapshot))
	for name := range snapshot {
		names = append(names, name)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tMEMORY (MiB)\tCOMPUTE\tPODS")
	for _, name := range names {
		for _, c := range snapshot[name] {
			model := c.Model
			if !c.Healthy {
				model += " (unhealthy)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s %6d/%-6d\t%s %3d%%\t%s\n", name, c.Index, model,
				bar(c.Used.MemoryMiB, c.Capacity.MemoryMiB), c.Used.MemoryMiB, c.Capacity.MemoryMiB,
				bar(c.Used.Cores, c.Capacity.Cores), c.Used.Cores, strings.Join(holders[c.UUID], ", "))
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

func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

func bar(used, capacity int64) string {
	filled := 0
	if capacity > 0 {
		filled = int(min(max(used, 0), capacity) * barWidth / capacity)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "]"
}

func unschedulableMessage(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message
		}
	}
	return "not scheduled yet"
}
