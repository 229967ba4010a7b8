package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/fleet"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func newTopCommand(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "List the containers on GPUs: memory and compute assigned, memory in use",
		Long: `List every container on GPUs, card by card, with the memory and compute share
its assignment gives it and, when the node agents are reachable through the
API server's pod proxy, the memory it uses.`,
		Example: `  kubectl tessera top -n ml
  kubectl tessera top -A`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := g.client()
			if err != nil {
				return err
			}
			ns := metav1.NamespaceAll
			if !all {
				if ns, err = g.namespace(); err != nil {
					return err
				}
			}
			return runTop(cmd.Context(), g, client, ns)
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the containers of every namespace")
	return cmd
}

func runTop(ctx context.Context, g *globals, client kubernetes.Interface, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	var rows []ContainerUsage
	nodes := map[string]bool{}
	var problems []error
	for i := range pods.Items {
		p := &pods.Items[i]
		if !fleet.Charged(p) {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(p.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			problems = append(problems, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		nodes[p.Spec.NodeName] = true
		for _, c := range gpuinfo.ContainerOrder(p) {
			for _, card := range a.Containers[c.Name] {
				rows = append(rows, ContainerUsage{Namespace: p.Namespace, Pod: p.Name, Container: c.Name, Node: p.Spec.NodeName,
					Card: card.Index, UUID: card.UUID, Slice: entrySlice(card), MemoryMiB: card.MemoryMiB, Cores: card.Cores})
			}
		}
	}
	warn(g.streams.ErrOut, problems)
	usage := &memoryUsage{}
	if len(rows) > 0 {
		usage = scrapeAgents(ctx, client, g.tesseraNamespace, nodes)
		for i := range rows {
			r := &rows[i]
			if v, ok := usage.lookup(r.Node, r.Namespace, r.Pod, r.Container, r.Card, r.UUID); ok {
				r.MemoryUsedMiB = &v
			}
		}
	}
	if g.output == outputJSON || g.output == outputYAML {
		list := ContainerUsageList{APIVersion: OutputAPIVersion, Kind: "GPUContainerUsageList", Items: rows, Unavailable: usage.unavailable}
		if list.Items == nil {
			list.Items = []ContainerUsage{}
		}
		return printStructured(g.streams.Out, g.output, list)
	}
	if len(rows) == 0 {
		where := "namespace " + ns
		if ns == metav1.NamespaceAll {
			where = "any namespace"
		}
		fmt.Fprintf(g.streams.ErrOut, "No containers on GPUs in %s.\n", where)
		return nil
	}
	measured := len(usage.nodes) > 0
	wide := g.output == outputWide
	tw := tabwriter.NewWriter(g.streams.Out, 0, 0, 2, ' ', 0)
	header := []string{"NAMESPACE", "POD", "CONTAINER", "NODE", "GPU"}
	if wide {
		header = append(header, "UUID")
	}
	header = append(header, "MEMORY (MiB)", "CORES")
	if measured {
		header = append(header, "USED (MiB)")
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		gpu := fmt.Sprint(r.Card)
		if r.Slice != "" {
			gpu += "/" + r.Slice
		}
		cells := []string{r.Namespace, r.Pod, r.Container, r.Node, gpu}
		if wide {
			cells = append(cells, r.UUID)
		}
		cells = append(cells, fmt.Sprint(r.MemoryMiB), fmt.Sprintf("%d%%", r.Cores))
		if measured {
			used := "-"
			if r.MemoryUsedMiB != nil {
				used = fmt.Sprintf("%.0f", *r.MemoryUsedMiB)
			}
			cells = append(cells, used)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(usage.unavailable) > 0 {
		what := "Memory in use is unavailable"
		if measured {
			what = "Memory in use is unavailable for some nodes"
		}
		fmt.Fprintf(g.streams.ErrOut, "\n%s:\n  %s\n", what, strings.Join(usage.unavailable, "\n  "))
	}
	return nil
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// entrySlice names an assignment entry's MIG slice (gpuinfo.SliceName); ""
// for a card.
func entrySlice(e gpuinfo.CardAssignment) string {
	if e.MIG == nil {
		return ""
	}
	return gpuinfo.SliceName(e.MIG.Profile, e.MIG.Start)
}
