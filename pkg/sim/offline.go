package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/trace"
)

// cardPercent is a card's capacity in the units sharing tasks ask for: a
// share of gpu_milli m takes ceil(m/10) % of the card's compute and memory,
// as the replayed pods ask (trace.Task.Limits).
const cardPercent = 100

// offlineBalances are the packer's starts: the weights, in bestFit, of
// keeping each node's free CPU in step with its free GPU. None is best on
// every task list; the packer keeps the best start.
var offlineBalances = []float64{0, 0.5, 0.75, 1, 1.25}

// OfflineResult is what the offline packer achieved.
type OfflineResult struct {
	// Allocation is the GPU placed in percent of the nodes' capacity.
	Allocation float64
	// Tasks is the tasks packed (those arrived), GPUTasks those asking for
	// GPU, Placed the GPU tasks placed, CPUPlaced the CPU-only tasks placed
	// in the room left.
	Tasks, GPUTasks, Placed, CPUPlaced int
	// Balance is the weight of keeping CPU in step with GPU of the start
	// that packed best.
	Balance float64
}

// OfflinePack packs, seeing them all at once, the tasks arrived when the
// arrived workload first reaches arrivedPercent of capacity (as the
// replay's curve counts them): an achievable offline result to set beside
// the online policies'. GPU tasks go in order of decreasing size (whole
// cards before shares, larger before smaller, fewer possible nodes first,
// more CPU first), each to the node and card where it fits best: the least
// room left on its card (or in whole cards), plus a weight times how far
// apart the node's free CPU and free GPU are left (a node whose CPU runs
// out before its GPU strands that GPU). The packer runs once per weight in
// offlineBalances and keeps the best. CPU-only tasks go last into the room
// left: they add no GPU. Cards, CPU and models are respected as the
// replays' scheduler does, and host memory too, which replayed pods do not
// ask: the packer is stricter than the replays. The placement is recounted
// and checked before it is returned.
func OfflinePack(nodes []trace.Node, arrivals []trace.Task, arrivedPercent int) (*OfflineResult, error) {
	nodes = GPUNodes(nodes)
	capacity := CapacityMilli(nodes)
	if capacity == 0 {
		return nil, fmt.Errorf("no GPU nodes")
	}
	tasks := arrived(arrivals, capacity, arrivedPercent)
	p, err := newPacker(nodes, tasks)
	if err != nil {
		return nil, err
	}
	var best *OfflineResult
	for _, balance := range offlineBalances {
		res, err := p.pack(balance, capacity)
		if err != nil {
			return nil, err
		}
		if best == nil || res.Allocation > best.Allocation {
			best = res
		}
	}
	return best, nil
}

// pack is one start of the offline packer, from an empty fleet.
func (p *packer) pack(balance float64, capacity int64) (*OfflineResult, error) {
	p.empty()
	p.balance = balance
	p.greedy()
	p.placeCPUOnly()
	if err := p.check(); err != nil {
		return nil, err
	}
	res := &OfflineResult{Tasks: len(p.tasks), Balance: balance}
	var placedMilli int64
	for i := range p.tasks {
		t := &p.tasks[i]
		if t.gpuMilli > 0 {
			res.GPUTasks++
		}
		if t.node < 0 {
			continue
		}
		if t.gpuMilli > 0 {
			res.Placed++
			placedMilli += t.gpuMilli
		} else {
			res.CPUPlaced++
		}
	}
	res.Allocation = float64(placedMilli) * 100 / float64(capacity)
	return res, nil
}

// packNode is a node's free room during packing.
type packNode struct {
	model            string
	cpuFree, memFree int64
	cpu, mem         int64
	cards            []int
	tasks            []int
}

// freePercent is the node's free GPU in card percent.
func (n *packNode) freePercent() int {
	free := 0
	for _, c := range n.cards {
		free += c
	}
	return free
}

// tightestCard is the card with the least room that still holds share
// percent, or -1.
func (n *packNode) tightestCard(share int) int {
	best := -1
	for c, free := range n.cards {
		if free >= share && (best < 0 || free < n.cards[best]) {
			best = c
		}
	}
	return best
}

// wholeFree counts the node's cards with nothing on them.
func (n *packNode) wholeFree() int {
	free := 0
	for _, c := range n.cards {
		if c == cardPercent {
			free++
		}
	}
	return free
}

// packTask is a task's demand and where it sits (node -1: not placed).
type packTask struct {
	name     string
	cpu, mem int64
	gpuMilli int64
	whole    int // cards taken whole
	share    int // percent of one card
	eligible []int
	node     int
	cards    []int
}

type packer struct {
	nodes []packNode
	tasks []packTask
	// order is the GPU tasks in packing order.
	order []int
	// balance weighs, in bestFit, keeping a node's free CPU in step with its
	// free GPU against leaving the least room on the card.
	balance float64
}

func newPacker(nodes []trace.Node, tasks []trace.Task) (*packer, error) {
	p := &packer{}
	for _, n := range nodes {
		cards := make([]int, n.GPUs)
		for i := range cards {
			cards[i] = cardPercent
		}
		p.nodes = append(p.nodes, packNode{model: strings.ToLower(n.Model), cpuFree: n.CPUMilli, memFree: n.MemoryMiB, cpu: n.CPUMilli, mem: n.MemoryMiB, cards: cards})
	}
	eligibleBySpec := map[string][]int{}
	for i, t := range tasks {
		pt := packTask{name: t.Name, cpu: t.CPUMilli, mem: t.MemoryMiB, gpuMilli: t.GPUMilliTotal(), node: -1}
		switch {
		case pt.gpuMilli == 0:
		case t.GPUMilli < 1000:
			pt.share = int((t.GPUMilli + 9) / 10)
		default:
			pt.whole = t.NumGPU
		}
		if pt.gpuMilli > 0 {
			spec := strings.Join(t.GPUSpec, ",")
			eligible, ok := eligibleBySpec[spec]
			if !ok {
				sel, err := gpuinfo.ParseSelector(t.Annotations())
				if err != nil {
					return nil, fmt.Errorf("task %s: %w", t.Name, err)
				}
				eligible = []int{}
				for j := range p.nodes {
					if sel.Matches(p.nodes[j].model, "") {
						eligible = append(eligible, j)
					}
				}
				eligibleBySpec[spec] = eligible
			}
			pt.eligible = eligible
			p.order = append(p.order, i)
		}
		p.tasks = append(p.tasks, pt)
	}
	// Decreasing size; among equals, the task with fewer possible nodes,
	// then more CPU, then arrival order.
	slices.SortStableFunc(p.order, func(a, b int) int {
		ta, tb := &p.tasks[a], &p.tasks[b]
		return cmp.Or(
			cmp.Compare(tb.whole, ta.whole),
			cmp.Compare(tb.share, ta.share),
			cmp.Compare(len(ta.eligible), len(tb.eligible)),
			cmp.Compare(tb.cpu, ta.cpu),
		)
	})
	return p, nil
}

// empty takes every task off the nodes.
func (p *packer) empty() {
	for n := range p.nodes {
		node := &p.nodes[n]
		node.cpuFree, node.memFree, node.tasks = node.cpu, node.mem, node.tasks[:0]
		for c := range node.cards {
			node.cards[c] = cardPercent
		}
	}
	for i := range p.tasks {
		p.tasks[i].node, p.tasks[i].cards = -1, nil
	}
}

// greedy places every GPU task, in packing order, where it fits best.
func (p *packer) greedy() {
	for _, i := range p.order {
		if n, ok := p.bestFit(i); ok {
			p.place(i, n, p.cardsFor(i, n))
		}
	}
}

// fitOn reports whether the task fits the node now, and the room it leaves
// there: on the card it would take for a share (tightestCard), in whole
// cards for whole-card tasks.
func (p *packer) fitOn(i, n int) (roomLeft int, ok bool) {
	t, node := &p.tasks[i], &p.nodes[n]
	if t.cpu > node.cpuFree || t.mem > node.memFree {
		return 0, false
	}
	switch {
	case t.share > 0:
		c := node.tightestCard(t.share)
		if c < 0 {
			return 0, false
		}
		return node.cards[c] - t.share, true
	case t.whole > 0:
		free := node.wholeFree()
		return (free - t.whole) * cardPercent, free >= t.whole
	}
	return 0, true
}

// cardsFor returns the cards the task takes on a node it fits: the card
// with the least room that holds a share, the lowest free ones for whole
// cards.
func (p *packer) cardsFor(i, n int) []int {
	t, node := &p.tasks[i], &p.nodes[n]
	if t.share > 0 {
		return []int{node.tightestCard(t.share)}
	}
	cards := make([]int, 0, t.whole)
	for c, room := range node.cards {
		if room == cardPercent && len(cards) < t.whole {
			cards = append(cards, c)
		}
	}
	return cards
}

// bestFit finds the node where the task fits best: the
// least room left on its card for a share, or in whole cards for whole-card
// tasks, in fractions of the node's GPU, plus balance times how far apart
// the node's free CPU and free GPU are left, each a fraction of the node's
// (a node whose CPU runs out before its GPU strands the GPU); ties go to
// the first node.
func (p *packer) bestFit(i int) (node int, ok bool) {
	node = -1
	var bestCost float64
	t := &p.tasks[i]
	for _, n := range t.eligible {
		room, fits := p.fitOn(i, n)
		if !fits {
			continue
		}
		nd := &p.nodes[n]
		gpus := float64(len(nd.cards) * cardPercent)
		gpuLeft := float64(nd.freePercent()-t.share-t.whole*cardPercent) / gpus
		cpuLeft := float64(nd.cpuFree-t.cpu) / float64(nd.cpu)
		cost := float64(room)/gpus + p.balance*math.Abs(cpuLeft-gpuLeft)
		if node < 0 || cost < bestCost {
			node, bestCost = n, cost
		}
	}
	return node, node >= 0
}

func (p *packer) place(i, n int, cards []int) {
	t, node := &p.tasks[i], &p.nodes[n]
	t.node, t.cards = n, cards
	node.cpuFree -= t.cpu
	node.memFree -= t.mem
	for _, c := range cards {
		if t.share > 0 {
			node.cards[c] -= t.share
		} else {
			node.cards[c] = 0
		}
	}
	node.tasks = append(node.tasks, i)
}

// placeCPUOnly puts the CPU-only tasks, in arrival order, on the node with
// the most CPU left that holds them.
func (p *packer) placeCPUOnly() {
	for i := range p.tasks {
		t := &p.tasks[i]
		if t.gpuMilli > 0 {
			continue
		}
		best := -1
		for n := range p.nodes {
			node := &p.nodes[n]
			if t.cpu <= node.cpuFree && t.mem <= node.memFree && (best < 0 || node.cpuFree > p.nodes[best].cpuFree) {
				best = n
			}
		}
		if best >= 0 {
			p.place(i, best, nil)
		}
	}
}

// check recomputes every node's use from the placement, independently of
// the bookkeeping, and reports a node or card over its capacity or a task
// on a model it does not accept.
func (p *packer) check() error {
	for n := range p.nodes {
		node := &p.nodes[n]
		var cpu, mem int64
		used := make([]int, len(node.cards))
		for _, j := range node.tasks {
			t := &p.tasks[j]
			cpu += t.cpu
			mem += t.mem
			if t.gpuMilli > 0 && !slices.Contains(t.eligible, n) {
				return fmt.Errorf("task %s placed on a node of model %s it does not accept", t.name, node.model)
			}
			for _, c := range t.cards {
				if t.share > 0 {
					used[c] += t.share
				} else {
					used[c] += cardPercent
				}
			}
			if t.whole != len(t.cards) && t.share == 0 || t.share > 0 && len(t.cards) != 1 {
				return fmt.Errorf("task %s holds %d cards", t.name, len(t.cards))
			}
		}
		if cpu > node.cpu || mem > node.mem {
			return fmt.Errorf("node %d: CPU %d of %d, memory %d of %d MiB", n, cpu, node.cpu, mem, node.mem)
		}
		for c, u := range used {
			if u > cardPercent {
				return fmt.Errorf("node %d card %d: %d %% taken", n, c, u)
			}
		}
	}
	return nil
}
