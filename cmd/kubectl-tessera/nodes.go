package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/fleet"
	"github.com/tessera-gpu/tessera/pkg/allocator"
)

func newNodesCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List every GPU node's cards: memory and compute allocated, pods, health",
		Long: `List every GPU node's cards with the memory and compute the pods bound there
hold, the pods holding each card (in all namespaces), and the card's health.
Usage is computed from the nodes' inventories and the pods' assignments with
the scheduler's own allocator.`,
		Example: `  kubectl tessera nodes
  kubectl tessera nodes -o wide
  kubectl tessera nodes -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := g.client()
			if err != nil {
				return err
			}
			return runNodes(cmd.Context(), g, client)
		},
	}
}

// agentState is what a node's agent means for new GPU pods.
type agentState struct {
	// short is "" when the agent does not keep pods off the node, else
	// e.g. "agent not ready"; message is the full reason.
	short, message string
}

func runNodes(ctx context.Context, g *globals, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	snapshot, err := fleet.Load(ctx, client)
	if err != nil {
		return err
	}
	warn(g.streams.ErrOut, snapshot.Problems)
	blocked := agentsBlocking(ctx, g, client)
	if g.output == outputJSON || g.output == outputYAML {
		list := CardList{APIVersion: OutputAPIVersion, Kind: "GPUCardList", Items: []CardStatus{}}
		for _, n := range snapshot.Nodes {
			for i, c := range n.Cards {
				if c.OnlyPossible(n.Used[i]) {
					continue
				}
				pods := make([]string, len(n.Holders[i]))
				for j, h := range n.Holders[i] {
					pods[j] = h.String()
				}
				uuid, slice := c.UUID, ""
				if c.Slice != nil {
					uuid, slice = c.Slice.DeviceUUID, c.Slice.Name()
				}
				list.Items = append(list.Items, CardStatus{
					Node: n.Name, Card: c.Index, UUID: uuid, Slice: slice, Model: c.Model, Healthy: c.Healthy, MIG: c.MIG, Claims: n.Claims,
					MemoryMiB: c.Capacity.MemoryMiB, MemoryAllocatedMiB: n.Used[i].MemoryMiB, CoresAllocated: n.Used[i].Cores,
					Pods: pods, Agent: blocked[n.Name].message,
				})
			}
		}
		return printStructured(g.streams.Out, g.output, list)
	}
	if len(snapshot.Nodes) == 0 {
		fmt.Fprintln(g.streams.ErrOut, "No GPU nodes: no node carries a GPU inventory or publishes Tessera's DRA devices (is the node agent running?).")
		return nil
	}
	wide, bars := g.output == outputWide, g.bars()
	tw := tabwriter.NewWriter(g.streams.Out, 0, 0, 2, ' ', 0)
	header := "NODE\tGPU\tMODEL\tMEMORY (MiB)\tCORES\tHEALTH\tPODS"
	if wide {
		header = "NODE\tGPU\tMODEL\tUUID\tMEMORY (MiB)\tCORES\tHEALTH\tAGENT\tPODS"
	}
	fmt.Fprintln(tw, header)
	for _, n := range snapshot.Nodes {
		if n.Err != nil {
			cells := []string{n.Name, "-", "-", "-", "-", "InvalidInventory", "-"}
			if wide {
				cells = []string{n.Name, "-", "-", "-", "-", "-", "InvalidInventory", agentCell(blocked, n.Name), "-"}
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
			continue
		}
		for i, c := range n.Cards {
			used := n.Used[i]
			if c.OnlyPossible(used) {
				continue
			}
			gpu, uuid := fmt.Sprint(c.Index), c.UUID
			if c.Slice != nil {
				gpu, uuid = fmt.Sprintf("%d/%s", c.Index, c.Slice.Name()), c.Slice.DeviceUUID
			}
			cells := []string{n.Name, gpu, n.Model(c)}
			if wide {
				cells = append(cells, uuid)
			}
			if c.MIG {
				// Its slices, on the next rows, hold its pods.
				cells = append(cells, "-", "-", health(c, blocked[n.Name].short))
			} else {
				cells = append(cells, memoryCell(used, c.Capacity, bars), coresCell(used, c.Capacity, bars), health(c, blocked[n.Name].short))
			}
			if wide {
				cells = append(cells, agentCell(blocked, n.Name))
			}
			cells = append(cells, podsCell(n.Holders[i]))
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
	}
	return tw.Flush()
}

// agentsBlocking returns, by node with a heartbeat Lease, the scheduler's
// reason for keeping new pods off the node because of its agent ("" when
// the agent does not), or nil when the Leases cannot be read. A failure to read the Leases is a
// warning: the cards are still shown.
func agentsBlocking(ctx context.Context, g *globals, client kubernetes.Interface) map[string]agentState {
	agents, err := fleet.Agents(ctx, client, g.tesseraNamespace)
	if err != nil {
		fmt.Fprintf(g.streams.ErrOut, "warning: agent heartbeats unknown: %v\n", err)
		return nil
	}
	blocked := map[string]agentState{}
	t := now()
	for node, a := range agents {
		short, message := a.Blocked(node, t, fleet.HeartbeatTimeout)
		blocked[node] = agentState{short: short, message: message}
	}
	return blocked
}

func agentCell(blocked map[string]agentState, node string) string {
	a, ok := blocked[node]
	switch {
	case blocked == nil:
		return "unknown"
	case !ok:
		return "no heartbeat"
	case a.message == "":
		return "reporting"
	}
	return a.message
}

func memoryCell(used, capacity allocator.Usage, bars bool) string {
	if bars {
		return fmt.Sprintf("%s %6d/%-6d", fleet.Bar(used.MemoryMiB, capacity.MemoryMiB), used.MemoryMiB, capacity.MemoryMiB)
	}
	return fmt.Sprintf("%d/%d", used.MemoryMiB, capacity.MemoryMiB)
}

func coresCell(used, capacity allocator.Usage, bars bool) string {
	if bars {
		return fmt.Sprintf("%s %3d%%", fleet.Bar(used.Cores, capacity.Cores), used.Cores)
	}
	return fmt.Sprintf("%d%%", used.Cores)
}

// health is the card's state for new work, its node's agent included.
func health(c allocator.Card, agent string) string {
	s := "Healthy"
	switch {
	case !c.Healthy:
		s = "Unhealthy"
	case c.MIG:
		s = "MIG mode"
	case c.Slice != nil && !c.Slice.Exists():
		s = "Being created"
	}
	if agent != "" {
		s += ", " + agent
	}
	return s
}

func podsCell(holders []fleet.PodRef) string {
	if len(holders) == 0 {
		return "-"
	}
	names := make([]string, len(holders))
	for i, h := range holders {
		names[i] = h.String()
	}
	return strings.Join(names, ", ")
}
