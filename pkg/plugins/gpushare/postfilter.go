package gpushare

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

var _ fwk.PostFilterPlugin = &Plugin{}

// maxQuoted bounds how much of a user-supplied value (a selector, an
// agent's reason) a message repeats.
const maxQuoted = 64

// PostFilter explains, in one sentence, why no node could hold a GPU pod:
// the per-node reasons kube-scheduler counts say what failed, this says by
// how much ("GPUs: the pod needs 1 GPU with 40960 MiB; 32 nodes have at
// most 24576 MiB free on a GPU; 8 nodes have no GPU matching model a100").
// It preempts nothing: it returns Unschedulable with that sentence, which
// kube-scheduler adds to the pod's condition and FailedScheduling Event, and
// GPUSharePreemption, configured after it, runs as usual. It runs only for
// pods that failed, and recomputes each node's answer off the Filter path,
// so it costs the scheduling of pods that fit nothing.
func (p *Plugin) PostFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s := getState(state)
	lister := p.handle.SnapshotSharedLister()
	if lister == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	nodes, err := lister.NodeInfos().List()
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	if s == nil {
		if why := p.explainClaims(pod, nodes); why != "" {
			return nil, fwk.NewStatus(fwk.Unschedulable, why)
		}
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	var sum summary
	claimNodes := p.claimNodes(nodes)
	for _, nodeInfo := range nodes {
		if st := statuses.Get(nodeInfo.Node().Name); st == nil || st.Plugin() != Name && !prunedByGPUShare(st) {
			continue // not rejected for its GPUs
		}
		sum.add(p.explain(s, nodeInfo, claimNodes))
	}
	if len(sum.entries) == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, sum.sentence(s.req))
}

// shortfall is why one node cannot hold the pod, with its figures.
type shortfall struct {
	// phrase describes the shortfall for nodes in the plural, with %s where
	// a figure goes; it is the grouping key.
	phrase string
	// figure is a node's own number for the phrase (the most memory free on
	// a card, the most cards with room); the summary keeps the largest.
	figure int64
	// example is a node-specific detail, shown for the first such node.
	example string
}

// explain answers Filter's question again for one node, with figures.
// claimNodes are the nodes whose cards are DRA devices.
func (p *Plugin) explain(s *cycleState, nodeInfo fwk.NodeInfo, claimNodes map[string]*claimNode) shortfall {
	node := nodeInfo.Node().Name
	if p.agentTimeout > 0 {
		if how, silent := p.silence(nodeInfo.Node(), p.agentTimeout); silent {
			return shortfall{phrase: "with a GPU agent not reporting", example: node + " " + how}
		}
	}
	if reason, unready := p.unready(node); unready {
		return shortfall{phrase: "with a GPU agent that cannot enforce assignments", example: node + ": " + truncate(reason, maxQuoted)}
	}
	out, err := p.fit(s, nodeInfo, p.records.lookup(nodeInfo.Node()), allocator.Strategy{Policy: p.gpuPolicy, Reserve: reservedOn(s.reservations, nodeInfo.Node())})
	switch {
	case errors.Is(err, ledger.ErrNoInventory) && claimNodes[node] != nil:
		return shortfall{phrase: "whose GPUs are DRA devices, for resource claims only"}
	case errors.Is(err, ledger.ErrNoInventory):
		return shortfall{phrase: "without GPUs"}
	case err != nil:
		return shortfall{phrase: "with an invalid GPU inventory", example: node}
	case out.Fits:
		return shortfall{phrase: "that could hold it now"}
	}
	f := out.Failure
	switch f.Kind {
	case allocator.NoMatchingCard:
		return shortfall{phrase: "with no GPU matching " + s.selector}
	case allocator.NoHealthyCard:
		return shortfall{phrase: "with no healthy GPU"}
	case allocator.InMIGMode:
		return shortfall{phrase: "with only GPUs in MIG mode"}
	case allocator.NoMIGSlice:
		return shortfall{phrase: "with no GPU in MIG mode with a healthy slice" + ofProfile(s.req.MIGProfile)}
	case allocator.Reserved:
		return shortfall{phrase: "whose free GPUs are reserved for other pods"}
	case allocator.TooFewCards:
		return shortfall{phrase: "with at most %s GPUs with room", figure: int64(f.Fit)}
	case allocator.NoLinkedSet:
		return shortfall{phrase: "with no " + strconv.Itoa(f.Container.Count) + " GPUs with room linked by " + gpuinfo.TopologyName(f.Link)}
	case allocator.NoTopology:
		return shortfall{phrase: "that report no GPU topology"}
	}
	c := f.Container
	switch {
	case f.InSlices && c != nil && c.Exclusive():
		return shortfall{phrase: "with at most %s MiB in a free MIG slice", figure: f.MostFree.MemoryMiB}
	case f.InSlices:
		return shortfall{phrase: "with at most %s MiB free in a MIG slice", figure: f.MostFree.MemoryMiB}
	case c == nil || c.Exclusive():
		return shortfall{phrase: "with no entirely free GPU"}
	case c.MemoryMiB > 0 && f.MostFree.MemoryMiB < c.MemoryMiB:
		return shortfall{phrase: "with at most %s MiB free on a GPU", figure: f.MostFree.MemoryMiB}
	case f.MostFree.Cores < c.Cores:
		return shortfall{phrase: "with at most %s% compute free on a GPU", figure: f.MostFree.Cores}
	}
	return shortfall{phrase: "with no GPU having both the memory and the compute free"}
}

// summary groups the nodes' shortfalls.
type summary struct {
	entries []*summaryEntry
}

type summaryEntry struct {
	shortfall
	nodes int
}

func (s *summary) add(sf shortfall) {
	for _, e := range s.entries {
		if e.phrase == sf.phrase {
			e.nodes++
			e.figure = max(e.figure, sf.figure)
			return
		}
	}
	s.entries = append(s.entries, &summaryEntry{shortfall: sf, nodes: 1})
}

// sentence is the summary, largest groups first (ties in a fixed order), e.g. "GPUs: the pod needs
// 1 GPU with 40960 MiB; 32 nodes with at most 24576 MiB free on a GPU".
// Its length is bounded: one clause per kind of shortfall, and user-supplied
// values truncated.
func (s *summary) sentence(req *gpuinfo.PodRequest) string {
	sort.Slice(s.entries, func(i, j int) bool {
		a, b := s.entries[i], s.entries[j]
		return a.nodes > b.nodes || a.nodes == b.nodes && a.phrase < b.phrase
	})
	var b strings.Builder
	b.WriteString("GPUs: the pod needs ")
	b.WriteString(describe(req))
	for _, e := range s.entries {
		b.WriteString("; ")
		b.WriteString(strconv.Itoa(e.nodes))
		if e.nodes == 1 {
			b.WriteString(" node ")
		} else {
			b.WriteString(" nodes ")
		}
		b.WriteString(strings.Replace(e.phrase, "%s", strconv.FormatInt(e.figure, 10), 1))
		if e.example != "" {
			b.WriteString(" (" + e.example + ")")
		}
	}
	return b.String()
}

// describe is the pod's GPU request in words: "2 GPUs with 40960 MiB and
// 30% compute each", "1 whole GPU", or, for several GPU containers, how many.
func describe(req *gpuinfo.PodRequest) string {
	if len(req.Containers) != 1 {
		return strconv.Itoa(len(req.Containers)) + " GPU containers placed together"
	}
	c := &req.Containers[0]
	switch {
	case req.Isolation == gpuinfo.OwnMIGSlice && c.MemoryMiB == 0:
		return "1 MIG slice" + ofProfile(req.MIGProfile)
	case req.Isolation == gpuinfo.OwnMIGSlice:
		return "1 MIG slice" + ofProfile(req.MIGProfile) + " with " + strconv.FormatInt(c.MemoryMiB, 10) + " MiB"
	case req.Isolation == gpuinfo.MIGSliceShare:
		return strconv.FormatInt(c.MemoryMiB, 10) + " MiB inside a MIG slice" + ofProfile(req.MIGProfile)
	}
	n := strconv.Itoa(c.Count) + " GPU"
	if c.Count > 1 {
		n += "s"
	}
	if c.Exclusive() && c.MemoryMiB == 0 && c.MemoryPercent == 0 {
		return strings.Replace(n, " GPU", " whole GPU", 1)
	}
	var parts []string
	switch {
	case c.MemoryMiB > 0:
		parts = append(parts, strconv.FormatInt(c.MemoryMiB, 10)+" MiB")
	case c.MemoryPercent > 0:
		parts = append(parts, strconv.FormatInt(c.MemoryPercent, 10)+"% of the memory")
	}
	if c.Cores > 0 {
		parts = append(parts, strconv.FormatInt(c.Cores, 10)+"% compute")
	}
	s := n + " with " + strings.Join(parts, " and ")
	if c.Count > 1 {
		s += " each"
	}
	return s
}

// ofProfile names a MIG profile asked for: " of profile 3g.40gb", or "".
func ofProfile(profile string) string {
	if profile == "" {
		return ""
	}
	return " of profile " + profile
}

// truncate cuts s to at most n bytes (on a rune boundary), marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
