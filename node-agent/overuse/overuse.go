// Package overuse catches containers that use more of a card than they
// hold. HAMi-core's limits are cooperative: a process can rewrite its own
// shared region, or never load the library (a static binary, an unusual
// CUDA path). NVML's per-process view, from outside the container, is what
// a container cannot fake: the detector compares the memory each holder's
// processes use on each card with the share it holds there, says so on the
// pod, and — when told to — stops the processes that take it.
package overuse

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/nri"
)

// Exceeded is a holder found using more of a card than it holds, on two
// readings in a row.
type Exceeded struct {
	// Containers are the holder's containers that use the card (several
	// for a claim shared by containers).
	Containers []nri.Running
	// Card is the card's index and UUID.
	Card int
	UUID string
	// UsedMiB is what the holder's processes use on the card (NVML);
	// HeldMiB is its share of the card's memory (0: it holds none).
	UsedMiB, HeldMiB int64
	// PIDs are the host PIDs of the processes using the card.
	PIDs []uint32
	// Stopped says whether the detector stopped those processes; StopErr
	// is why some could not be.
	Stopped bool
	StopErr error
}

// Detector compares use with shares on every Check.
type Detector struct {
	// Stats reads the cards' processes.
	Stats *discovery.BoundedStats
	// Running lists the containers the runtime runs, with their shares
	// (the NRI plugin's view).
	Running func() []nri.Running
	// ProcRoot is where processes are matched to containers ("/proc").
	ProcRoot string
	// Stop, when set, makes the detector kill the processes of a holder
	// over its share on the card (opt-in: --stop-over-use).
	Stop bool
	// Report is told each new episode of over-use (not again until the
	// holder is back within its share); it must not block.
	Report func(Exceeded)

	// kill replaces discovery.KillContainerProcess in tests.
	kill func(procRoot string, pid uint32, container string) error
	// over counts the consecutive readings each holder was over its
	// share on each card; reported marks episodes already told.
	over     map[holderCard]int
	reported map[holderCard]bool
}

// holderCard is one holder on one card.
type holderCard struct{ key, uuid string }

// readingsToReport is how many readings in a row a holder must be over its
// share before it is reported: one reading may catch memory a process is
// about to free.
const readingsToReport = 2

// Check reads the cards' processes once and acts on holders over their
// share.
func (d *Detector) Check(ctx context.Context) {
	logger := klog.FromContext(ctx)
	stats, err := d.Stats.Read()
	if err != nil {
		logger.V(2).Info("Over-use check: some GPU statistics unread", "err", err)
	}
	running := d.Running()
	byID := make(map[string]nri.Running, len(running))
	for _, r := range running {
		byID[r.ID] = r
	}
	known := func(id string) bool { _, ok := byID[id]; return ok }
	if d.over == nil {
		d.over, d.reported = map[holderCard]int{}, map[holderCard]bool{}
	}
	seen := map[holderCard]bool{}
	for _, st := range stats {
		if !st.ProcessesKnown {
			continue
		}
		type use struct {
			mib        int64
			pids       []uint32
			containers map[string]nri.Running
			held       int64
		}
		uses := map[string]*use{}
		for _, proc := range st.Processes {
			id := proc.ContainerID
			if id == "" && proc.PID != 0 {
				id = discovery.ContainerOfProcess(d.ProcRoot, proc.PID, known)
			}
			ctr, ok := byID[id]
			if !ok || ctr.Unrestricted {
				continue // no known container (the metrics sum these), or left alone
			}
			key, held := holding(ctr, st.UUID)
			u := uses[key]
			if u == nil {
				u = &use{containers: map[string]nri.Running{}, held: held}
				uses[key] = u
			}
			u.mib += proc.MemoryUsedMiB
			if proc.PID != 0 {
				u.pids = append(u.pids, proc.PID)
			}
			u.containers[ctr.ID] = ctr
		}
		// In holder order, so that reports come in the same order on every
		// check.
		for _, key := range slices.Sorted(maps.Keys(uses)) {
			u := uses[key]
			hc := holderCard{key, st.UUID}
			if u.mib <= u.held {
				continue
			}
			seen[hc] = true
			d.over[hc]++
			if d.over[hc] < readingsToReport || (d.reported[hc] && !d.Stop) {
				continue
			}
			e := Exceeded{Card: st.Index, UUID: st.UUID, UsedMiB: u.mib, HeldMiB: u.held, PIDs: u.pids}
			for _, id := range slices.Sorted(maps.Keys(u.containers)) {
				e.Containers = append(e.Containers, u.containers[id])
			}
			if d.Stop {
				e.StopErr = d.stop(u.pids, u.containers)
				e.Stopped = e.StopErr == nil
			}
			logger.Info("Container uses more GPU memory than it holds", "card", e.Card, "usedMiB", e.UsedMiB, "heldMiB", e.HeldMiB,
				"containers", len(e.Containers), "stopped", e.Stopped, "stopError", e.StopErr)
			if !d.reported[hc] || e.Stopped {
				d.reported[hc] = true
				if d.Report != nil {
					d.Report(e)
				}
			}
		}
	}
	for hc := range d.over {
		if !seen[hc] { // back within its share, or gone
			delete(d.over, hc)
			delete(d.reported, hc)
		}
	}
}

// Use returns what the processes of the container with runtime ID id use
// on each card, in MiB by card UUID, from NVML's per-process view (what the
// container cannot fake). A card whose processes NVML could not list is an
// error: the use there is unknown.
func (d *Detector) Use(id string) (map[string]int64, error) {
	uses, err := d.Uses()
	if err != nil {
		return nil, err
	}
	if use := uses[id]; use != nil {
		return use, nil
	}
	return map[string]int64{}, nil
}

// Uses returns what the processes of every running container use on each
// card: MiB by card UUID, by container ID (containers using no card are
// left out, and so are processes of no container). A card whose processes NVML could not list is an error.
func (d *Detector) Uses() (map[string]map[string]int64, error) {
	// An error may be about other readings (utilisation, temperature):
	// what counts is whether each card's processes were listed.
	stats, err := d.Stats.Read()
	if len(stats) == 0 && err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, r := range d.Running() {
		known[r.ID] = true
	}
	uses := map[string]map[string]int64{}
	for _, st := range stats {
		if !st.ProcessesKnown {
			return nil, fmt.Errorf("the processes on card %d are unknown", st.Index)
		}
		for _, proc := range st.Processes {
			owner := proc.ContainerID
			if owner == "" && proc.PID != 0 {
				owner = discovery.ContainerOfProcess(d.ProcRoot, proc.PID, func(c string) bool { return known[c] })
			}
			if owner == "" {
				continue // no container's
			}
			if uses[owner] == nil {
				uses[owner] = map[string]int64{}
			}
			uses[owner][st.UUID] += proc.MemoryUsedMiB
		}
	}
	return uses, nil
}

// holding is the key of what the container holds on the card with uuid,
// and the memory it holds there: one of its holdings, or — for a card it
// holds nothing of — the container itself, holding none.
func holding(ctr nri.Running, uuid string) (string, int64) {
	for _, h := range ctr.Holdings {
		for _, c := range h.Cards {
			if c.UUID == uuid {
				return h.Key, c.MemoryMiB
			}
		}
	}
	return "unheld/" + ctr.ID, 0
}

// stop kills the processes, each checked to be still one of the
// containers'.
func (d *Detector) stop(pids []uint32, containers map[string]nri.Running) error {
	kill := d.kill
	if kill == nil {
		kill = discovery.KillContainerProcess
	}
	var failed []string
	for _, pid := range pids {
		var err error
		for id := range containers {
			if err = kill(d.ProcRoot, pid, id); err == nil {
				break
			}
		}
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(pids) == 0 {
		return errors.New("NVML named no process")
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "; "))
	}
	return nil
}
