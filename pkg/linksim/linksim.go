// Package linksim is a seeded churn simulation of whole-card pods of 1, 2, 4
// and 8 cards arriving and leaving on a fleet of nodes with card topologies
// (topology.Shapes). Each policy places the same arrivals: Tessera's
// allocator with and without the nodes' links, under each card policy, and a
// HAMi-like baseline that chooses the set with the best sum of pairwise link
// scores. It measures how many multi-card pods got NVLink, or the best link
// their node offers, and the GPU allocation over time.
//
// Node choice follows the GPUShare plugin's Score and NormalizeScore with no
// other score plugin: the best link rank first (allocator.Outcome.LinkRank),
// then the policy's preference.
package linksim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/topology"
)

// Policy is one way of placing pods.
type Policy struct {
	Name string
	// Cards is the allocator's card policy.
	Cards allocator.Policy
	// Topology gives the allocator the nodes' links.
	Topology bool
	// Pairwise replaces the allocator's card choice by the HAMi-like
	// baseline: for several cards the set with the best sum of pairwise
	// link classes, for one card the card least linked to the free others;
	// nodes by Binpack.
	Pairwise bool
}

// Policies are the policies compared.
var Policies = []Policy{
	{Name: "binpack", Cards: allocator.Binpack, Topology: true},
	{Name: "binpack, no topology", Cards: allocator.Binpack},
	{Name: "spread", Cards: allocator.Spread, Topology: true},
	{Name: "spread, no topology", Cards: allocator.Spread},
	{Name: "fragmentation-aware", Cards: allocator.FragmentationAware, Topology: true},
	{Name: "fragmentation-aware, no topology", Cards: allocator.FragmentationAware},
	{Name: "pairwise (HAMi-like)", Cards: allocator.Binpack, Pairwise: true},
}

// NodeGroup is a number of alike nodes.
type NodeGroup struct {
	Shape string
	Cards int
	Count int
}

// DefaultFleet has NVLink scarce enough that where a pod goes matters: 4
// NVSwitch nodes, 8 of two NVLink quads and 8 of four PCIe cards.
var DefaultFleet = []NodeGroup{
	{Shape: topology.NVSwitch, Cards: 8, Count: 4},
	{Shape: topology.NVLinkQuads, Cards: 8, Count: 8},
	{Shape: topology.PCIeSockets, Cards: 4, Count: 8},
}

// SizeWeight is how often pods of a size arrive.
type SizeWeight struct {
	Cards  int
	Weight float64
}

// DefaultMix is half single-card pods, then fewer as they grow.
var DefaultMix = []SizeWeight{{1, 0.5}, {2, 0.25}, {4, 0.15}, {8, 0.10}}

// Config is one simulation.
type Config struct {
	Seed  uint64
	Fleet []NodeGroup
	Mix   []SizeWeight
	// Pods is how many pods arrive.
	Pods int
	// Load is the offered load: the cards the arriving pods would hold on
	// average, as a fraction of the fleet's.
	Load float64
}

// Result is one policy's outcome of a simulation.
type Result struct {
	Policy string
	Seed   uint64
	// Allocation is the time-averaged fraction of cards held while the
	// second half of the pods arrive.
	Allocation float64
	// Placed, OnNVLink and AtBest count placed pods by size: all of them,
	// those whose cards are all linked by NVLink, and those on the best
	// worst link any set of their size has on their node's shape.
	Placed, OnNVLink, AtBest map[int]int
	// Waiting is how many pods had not been placed when the last arrived.
	Waiting int
	// MeanWaitSeconds is the mean time placed multi-card pods waited.
	MeanWaitSeconds float64
}

// meanLifetime is a pod's mean time on its cards, in seconds.
const meanLifetime = 3600.0

// node is one node of the simulation.
type node struct {
	shape string
	cards []allocator.Card
	used  []allocator.Usage
	// best is, by pod size, the best worst link a set of that size has on
	// the empty node.
	best map[int]gpuinfo.LinkClass
}

// pod is an arrived pod.
type pod struct {
	id      int
	size    int
	arrived float64
}

// event is a pod leaving.
type event struct {
	at   float64
	node int
	pod  *placed
}

// placed is a pod on its cards.
type placed struct {
	cards []int
}

type departures []event

func (d departures) Len() int           { return len(d) }
func (d departures) Less(i, j int) bool { return d[i].at < d[j].at }
func (d departures) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)        { *d = append(*d, x.(event)) }
func (d *departures) Pop() any {
	old := *d
	e := old[len(old)-1]
	*d = old[:len(old)-1]
	return e
}

// Run simulates the policy on the configuration.
func Run(cfg Config, p Policy) (*Result, error) {
	nodes, total, err := buildFleet(cfg.Fleet, p.Topology)
	if err != nil {
		return nil, err
	}
	var meanSize, weights float64
	for _, m := range cfg.Mix {
		meanSize += float64(m.Cards) * m.Weight
		weights += m.Weight
	}
	meanSize /= weights
	rate := cfg.Load * float64(total) / (meanSize * meanLifetime)
	var w *allocator.Workload
	if p.Cards == allocator.FragmentationAware {
		w = mixWorkload(cfg.Mix, weights)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 34))
	r := &Result{Policy: p.Name, Seed: cfg.Seed, Placed: map[int]int{}, OnNVLink: map[int]int{}, AtBest: map[int]int{}}
	var queue []pod
	var leaving departures
	held, now, measuredSince, heldTime := 0, 0.0, -1.0, 0.0
	var waited float64
	var multiPlaced int
	advance := func(to float64) {
		if measuredSince >= 0 {
			heldTime += float64(held) * (to - now)
		}
		now = to
	}
	schedule := func() {
		kept := queue[:0]
		for _, pd := range queue {
			ni, cards := choose(nodes, pd.size, p, w)
			if ni < 0 {
				kept = append(kept, pd)
				continue
			}
			n := &nodes[ni]
			for _, c := range cards {
				n.used[c] = n.cards[c].Capacity
			}
			held += pd.size
			r.Placed[pd.size]++
			if pd.size > 1 {
				worst := worstLink(n, cards)
				if worst == gpuinfo.LinkNVLink {
					r.OnNVLink[pd.size]++
				}
				if worst >= n.best[pd.size] {
					r.AtBest[pd.size]++
				}
				waited += now - pd.arrived
				multiPlaced++
			}
			heap.Push(&leaving, event{at: now + rng.ExpFloat64()*meanLifetime, node: ni, pod: &placed{cards: cards}})
		}
		queue = kept
	}
	arrival := 0.0
	for i := 0; i < cfg.Pods; i++ {
		arrival += rng.ExpFloat64() / rate
		size := drawSize(rng, cfg.Mix, weights)
		for leaving.Len() > 0 && leaving[0].at <= arrival {
			e := heap.Pop(&leaving).(event)
			advance(e.at)
			for _, c := range e.pod.cards {
				nodes[e.node].used[c] = allocator.Usage{}
			}
			held -= len(e.pod.cards)
			schedule()
		}
		advance(arrival)
		if i == cfg.Pods/2 {
			measuredSince = now
		}
		queue = append(queue, pod{id: i, size: size, arrived: now})
		schedule()
	}
	if now > measuredSince && measuredSince >= 0 {
		r.Allocation = heldTime / (now - measuredSince) / float64(total)
	}
	r.Waiting = len(queue)
	if multiPlaced > 0 {
		r.MeanWaitSeconds = waited / float64(multiPlaced)
	}
	return r, nil
}

// buildFleet makes the nodes, with their links when withLinks.
func buildFleet(fleet []NodeGroup, withLinks bool) ([]node, int, error) {
	var nodes []node
	total := 0
	for _, g := range fleet {
		if !topology.Valid(g.Shape) || g.Cards < 1 || g.Cards > gpuinfo.MaxCardsPerNode {
			return nil, 0, fmt.Errorf("node group %+v: unknown shape or card count out of range", g)
		}
		for range g.Count {
			inv := &gpuinfo.Inventory{Version: gpuinfo.InventoryVersion1}
			for i := range g.Cards {
				inv.Cards = append(inv.Cards, gpuinfo.Card{
					Index: i, UUID: fmt.Sprintf("GPU-%d-%d", len(nodes), i), Model: "H100",
					MemoryMiB: 81920, Cores: gpuinfo.FullCores, Healthy: true,
				})
			}
			topology.Apply(inv, g.Shape)
			n := node{shape: g.Shape, best: bestLinks(inv)}
			if !withLinks {
				inv.Links = ""
			}
			n.cards = allocator.NewCards(inv)
			n.used = make([]allocator.Usage, len(n.cards))
			nodes = append(nodes, n)
			total += g.Cards
		}
	}
	return nodes, total, nil
}

// bestLinks is, for each pod size, the best worst link a set of that many of
// the inventory's cards has: Place on the empty node with the links.
func bestLinks(inv *gpuinfo.Inventory) map[int]gpuinfo.LinkClass {
	cards := allocator.NewCards(inv)
	best := map[int]gpuinfo.LinkClass{}
	for size := 2; size <= len(cards); size++ {
		req := wholeCards(size)
		out := allocator.Place(cards, make([]allocator.Usage, len(cards)), nil, &req, allocator.Strategy{}, nil)
		best[size] = out.Link
	}
	return best
}

// mixWorkload is the arrival mix as the fragmentation-aware policy's
// workload.
func mixWorkload(mix []SizeWeight, weights float64) *allocator.Workload {
	w := &allocator.Workload{}
	for _, m := range mix {
		w.Shapes = append(w.Shapes, allocator.Shape{Weight: m.Weight / weights, Container: wholeCards(m.Cards).Containers[0]})
	}
	return w
}

func wholeCards(n int) gpuinfo.PodRequest {
	return gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: n, Cores: gpuinfo.FullCores}}}
}

func drawSize(rng *rand.Rand, mix []SizeWeight, weights float64) int {
	x := rng.Float64() * weights
	for _, m := range mix {
		if x < m.Weight {
			return m.Cards
		}
		x -= m.Weight
	}
	return mix[len(mix)-1].Cards
}

// choose picks the node and cards for a pod of size cards; -1 when none fits.
func choose(nodes []node, size int, p Policy, w *allocator.Workload) (int, []int) {
	if p.Pairwise {
		return choosePairwise(nodes, size)
	}
	req := wholeCards(size)
	st := allocator.Strategy{Policy: p.Cards, Workload: w}
	best, bestRank, bestKey, bestDamage := -1, int64(0), math.Inf(-1), int64(0)
	for i := range nodes {
		n := &nodes[i]
		out := allocator.Place(n.cards, n.used, nil, &req, st, nil)
		if !out.Fits {
			continue
		}
		rank, key := out.LinkRank(), float64(out.UsedPermille)
		switch p.Cards {
		case allocator.Spread:
			key = -key
		case allocator.FragmentationAware:
			key = -out.FragmentationDelta*1e4 + key
		}
		d := out.LinkDamage
		if p.Cards == allocator.Spread {
			d = 0
		}
		if best < 0 || rank > bestRank || rank == bestRank && (d < bestDamage || d == bestDamage && key > bestKey) {
			best, bestRank, bestKey, bestDamage = i, rank, key, d
		}
	}
	if best < 0 {
		return -1, nil
	}
	n := &nodes[best]
	a := &gpuinfo.Assignment{Containers: map[string][]gpuinfo.CardAssignment{}}
	allocator.Place(n.cards, n.used, nil, &req, st, a)
	var cards []int
	for _, e := range a.Containers["c"] {
		cards = append(cards, e.Index)
	}
	return best, cards
}

// worstLink is the worst link between the node's cards, by the shape.
func worstLink(n *node, cards []int) gpuinfo.LinkClass {
	worst := gpuinfo.LinkNVLink
	for x := range cards {
		for y := x + 1; y < len(cards); y++ {
			worst = min(worst, topology.Link(n.shape, len(n.cards), cards[x], cards[y]))
		}
	}
	return worst
}
