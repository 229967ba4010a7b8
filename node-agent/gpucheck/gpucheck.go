// Package gpucheck is the node agent's prepared check against a real card
// (docs/node-agent.md, "Checking a real card"): it runs the agent's own
// discovery, statistics and XID watch through a backend, validates what
// they return — the inventory the agent would publish, UUIDs, memory,
// models, NUMA nodes, health, MIG geometry, links — times a scan, and
// writes what it found. It reads only: it never changes a card's settings.
package gpucheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Backend is what the check runs: the agent's NVML backend on a node, a
// mock in tests.
type Backend interface {
	discovery.Backend
	discovery.StatsReader
	discovery.XIDWatcher
}

// Options are the check's budgets.
type Options struct {
	// Scans is how many discovery scans are timed.
	Scans int
	// XIDWait is how long the XID watch listens.
	XIDWait time.Duration
}

// DefaultOptions fit a lent machine's minutes: five scans, ten seconds of
// XID events.
var DefaultOptions = Options{Scans: 5, XIDWait: 10 * time.Second}

// Report is what the check found.
type Report struct {
	Backend string `json:"backend"`
	// Inventory is what the agent would publish (newest version).
	Inventory *gpuinfo.Inventory `json:"inventory,omitempty"`
	// ScanMillis are the timed scans' durations.
	ScanMillis []float64 `json:"scanMillis,omitempty"`
	// Stats are each card's live reading, processes included.
	Stats []discovery.CardStats `json:"stats,omitempty"`
	// XIDs are the events the watch reported.
	XIDs []XID `json:"xids"`
	// Checks are the verdicts, in the order run.
	Checks []Check `json:"checks"`
}

// XID is one XID event.
type XID struct {
	UUID string `json:"uuid"`
	XID  uint64 `json:"xid"`
}

// Check is one verdict.
type Check struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	Detail string `json:"detail"`
}

// Passed reports whether every check passed.
func (r *Report) Passed() bool {
	return !slices.ContainsFunc(r.Checks, func(c Check) bool { return !c.Passed })
}

// Summary is the report in a few lines, failures first.
func (r *Report) Summary() string {
	var b strings.Builder
	verdict := "PASSED"
	if !r.Passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "tessera-gpu-check %s: %s\n", verdict, r.Backend)
	for _, failed := range []bool{true, false} {
		for _, c := range r.Checks {
			if c.Passed != failed {
				mark := "ok  "
				if failed {
					mark = "FAIL"
				}
				fmt.Fprintf(&b, "%s %-15s %s\n", mark, c.Name, c.Detail)
			}
		}
	}
	return b.String()
}

func (r *Report) check(name string, passed bool, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Passed: passed, Detail: fmt.Sprintf(format, args...)})
}

// Run runs every check through b.
func Run(ctx context.Context, b Backend, opts Options) *Report {
	r := &Report{Backend: b.Name(), XIDs: []XID{}}
	cards, err := b.Cards()
	if err != nil || len(cards) == 0 {
		r.check("discovery", false, "no card found: %v", err)
		return r
	}
	r.check("discovery", true, "%d cards", len(cards))
	r.checkInventory(cards)
	r.checkCards(cards)
	r.timeScans(b, opts.Scans)
	r.checkStats(b, len(cards))
	r.watchXIDs(ctx, b, opts.XIDWait)
	return r
}

// checkInventory validates the inventory the agent would publish.
func (r *Report) checkInventory(cards []discovery.Card) {
	r.Inventory = discovery.Inventory(cards, gpuinfo.InventoryVersion2)
	raw, err := r.Inventory.Encode()
	if err == nil {
		_, err = gpuinfo.DecodeInventory(raw)
	}
	r.check("inventory", err == nil, "version %d, %d bytes: %v", r.Inventory.Version, len(raw), errOrOK(err))
	switch {
	case len(cards) < 2:
		r.check("topology", true, "one card: no links to measure")
	case r.Inventory.Links == "":
		r.check("topology", false, "%d cards, no link between any two measured", len(cards))
	default:
		r.check("topology", !strings.ContainsRune(r.Inventory.Links, rune(gpuinfo.LinkLetters[gpuinfo.LinkUnknown])), "links %q (pairs, nvidia-smi topo's legend; ? unknown)", r.Inventory.Links)
	}
}

// checkCards checks each card's fields.
func (r *Report) checkCards(cards []discovery.Card) {
	var uuids, memory, models, numa, health, mig []string
	seen := map[string]bool{}
	for _, c := range cards {
		if !strings.HasPrefix(c.UUID, "GPU-") || seen[c.UUID] {
			uuids = append(uuids, fmt.Sprintf("card %d: %q", c.Index, c.UUID))
		}
		seen[c.UUID] = true
		if c.MemoryMiB <= 0 || c.MemoryMiB > gpuinfo.MaxCardMemoryMiB {
			memory = append(memory, fmt.Sprintf("card %d: %d MiB", c.Index, c.MemoryMiB))
		}
		if strings.TrimSpace(c.Model) == "" {
			models = append(models, fmt.Sprintf("card %d", c.Index))
		}
		if c.NUMANode < -1 {
			numa = append(numa, fmt.Sprintf("card %d: %d", c.Index, c.NUMANode))
		}
		if !c.Healthy {
			health = append(health, fmt.Sprintf("card %d", c.Index))
		}
		if c.MIGEnabled && c.MIG == nil {
			mig = append(mig, fmt.Sprintf("card %d: in MIG mode, geometry unread", c.Index))
		}
	}
	first := cards[0]
	r.check("uuids", len(uuids) == 0, "%s", orList(uuids, fmt.Sprintf("%d distinct, e.g. %s", len(seen), first.UUID)))
	r.check("memory", len(memory) == 0, "%s", orList(memory, fmt.Sprintf("card 0: %d MiB", first.MemoryMiB)))
	r.check("models", len(models) == 0, "%s", orList(models, "card 0: "+first.Model))
	r.check("numa", len(numa) == 0, "%s", orList(numa, fmt.Sprintf("card 0: NUMA node %d (-1: unknown), PCIe root %q", first.NUMANode, first.PCIeRoot)))
	r.check("health", len(health) == 0, "%s", orList(health, "every card healthy"))
	modes := 0
	for _, c := range cards {
		if c.MIGEnabled {
			modes++
		}
	}
	r.check("mig", len(mig) == 0, "%s", orList(mig, fmt.Sprintf("%d of %d cards in MIG mode, geometry read", modes, len(cards))))
}

// timeScans times scans discovery scans.
func (r *Report) timeScans(b Backend, scans int) {
	var failed error
	for range scans {
		start := time.Now()
		if _, err := b.Cards(); err != nil {
			failed = err
		}
		r.ScanMillis = append(r.ScanMillis, float64(time.Since(start).Microseconds())/1000)
	}
	if len(r.ScanMillis) == 0 {
		return
	}
	r.check("scan-time", failed == nil, "%d scans, %.1f–%.1f ms: %v", scans, slices.Min(r.ScanMillis), slices.Max(r.ScanMillis), errOrOK(failed))
}

// checkStats reads the cards' statistics: per-process memory is what
// over-use detection and right-sizing read.
func (r *Report) checkStats(b Backend, cards int) {
	stats, err := b.Stats()
	r.Stats = stats
	unknown := 0
	processes := 0
	for _, s := range stats {
		if !s.ProcessesKnown {
			unknown++
		}
		processes += len(s.Processes)
	}
	passed := len(stats) == cards && unknown == 0
	r.check("processes", passed, "%d of %d cards read, processes unknown on %d, %d processes: %v", len(stats), cards, unknown, processes, errOrOK(err))
}

// watchXIDs listens for XID events for wait: the watch must register and
// keep running until told to stop.
func (r *Report) watchXIDs(ctx context.Context, b Backend, wait time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	events := make(chan XID, 64)
	err := b.WatchXIDs(ctx, func(uuid string, xid uint64) {
		select {
		case events <- XID{UUID: uuid, XID: xid}:
		default:
		}
	})
	close(events)
	for e := range events {
		r.XIDs = append(r.XIDs, e)
	}
	passed := err == nil || errors.Is(err, context.DeadlineExceeded)
	if passed && ctx.Err() == nil {
		passed, err = false, errors.New("the watch ended before it was told to")
	}
	r.check("xid-watch", passed, "listened %v, %d events: %v", wait, len(r.XIDs), errOrOK(err))
}

func errOrOK(err error) string {
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err.Error()
	}
	return "ok"
}

// orList is the problems joined, or ok when there are none.
func orList(problems []string, ok string) string {
	if len(problems) == 0 {
		return ok
	}
	return strings.Join(problems, "; ")
}
