// Package rightsize measures, for automatic right-sizing (docs/resize.md),
// the GPU memory that the node's opted-in containers use: each reading is
// NVML's per-process view from outside the container (what it cannot fake),
// kept as per-minute peaks over the pod's quiet period, and reported on the
// agent's heartbeat Lease (gpuinfo.AgentUseAnnotation). The scheduler's
// resize controller decides from the report; the agent decides nothing.
package rightsize

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// MaxReported bounds the containers one report carries, so that it stays
// within the annotation's size (gpuinfo.MaxAnnotationBytes); the others are
// left out (and so not right-sized) until there is room.
const MaxReported = 256

// Meter reads the use of the opted-in containers on every Read (the agent
// calls it every heartbeat interval) and reports it.
type Meter struct {
	// Running lists the containers the runtime runs, with their shares.
	Running func() []nri.Running
	// Pod returns a pod bound to the node, from the agent's cache.
	Pod func(ctx context.Context, namespace, name string) (*v1.Pod, error)
	// Uses reads what every container uses on each card: MiB by card UUID,
	// by container ID.
	Uses func() (map[string]map[string]int64, error)
	// Invalid, when set, is told once of each pod whose annotation is
	// invalid (it must not block).
	Invalid func(pod *v1.Pod, err error)
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu     sync.Mutex
	tracks map[string]*track // by container ID
	// warned holds the pods whose annotation was found invalid (logged
	// once per pod).
	warned map[string]bool
}

// track is what is known of one container's use.
type track struct {
	owner nri.Owner
	// since is when the readings began (the first reading, or the last one
	// that failed).
	since time.Time
	quiet time.Duration
	last  int64
	// minutes are the peaks of each minute read, oldest first, none older
	// than gpuinfo.MaxQuietPeriod.
	minutes []minutePeak
}

type minutePeak struct {
	minute int64 // Unix minutes
	mib    int64
}

// Read takes one reading of every opted-in container holding shares. A
// failed reading restarts every container's window: a quiet period counts
// only readings that were taken.
func (m *Meter) Read(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := m.now()
	opted := m.optedIn(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tracks == nil {
		m.tracks = map[string]*track{}
	}
	for id := range m.tracks {
		if _, ok := opted[id]; !ok {
			delete(m.tracks, id) // gone, or opted out
		}
	}
	if len(opted) == 0 {
		return
	}
	uses, err := m.Uses()
	if err != nil {
		logger.V(2).Info("Right-sizing: GPU use unread; the quiet periods start again", "err", err)
		for _, t := range m.tracks {
			t.since, t.minutes = now, nil
		}
		return
	}
	minute := now.Unix() / 60
	oldest := now.Add(-gpuinfo.MaxQuietPeriod).Unix() / 60
	for id, o := range opted {
		t := m.tracks[id]
		if t == nil {
			t = &track{owner: o.owner, since: now}
			m.tracks[id] = t
		}
		t.quiet = o.quiet
		var use int64
		for _, uuid := range o.cards {
			use = max(use, uses[id][uuid])
		}
		t.last = use
		if n := len(t.minutes); n > 0 && t.minutes[n-1].minute == minute {
			t.minutes[n-1].mib = max(t.minutes[n-1].mib, use)
		} else {
			t.minutes = append(t.minutes, minutePeak{minute, use})
		}
		drop := 0
		for drop < len(t.minutes) && t.minutes[drop].minute < oldest {
			drop++
		}
		t.minutes = t.minutes[drop:]
	}
}

// opted is an opted-in container: its owner, quiet period and cards.
type opted struct {
	owner nri.Owner
	quiet time.Duration
	cards []string
}

// podWait bounds the wait for a pod in the agent's cache.
const podWait = time.Second

// optedIn finds the running containers holding shares whose pod opted in.
func (m *Meter) optedIn(ctx context.Context) map[string]opted {
	ctx, cancel := context.WithTimeout(ctx, podWait)
	defer cancel()
	out := map[string]opted{}
	invalid := map[string]error{} // by pod UID
	pods := map[string]*v1.Pod{}
	for _, r := range m.Running() {
		if r.Unrestricted || len(r.Holdings) == 0 {
			continue
		}
		var cards []string
		for _, h := range r.Holdings {
			for _, c := range h.Cards {
				if c.MIG == nil && c.Cores < gpuinfo.FullCores {
					cards = append(cards, c.UUID)
				}
			}
		}
		if len(cards) == 0 {
			continue // whole cards or MIG slices: not resized
		}
		pod, err := m.Pod(ctx, r.Namespace, r.Pod)
		if err != nil || pod.UID != r.PodUID {
			continue
		}
		quiet, on, err := gpuinfo.QuietPeriod(pod)
		if err != nil {
			invalid[string(pod.UID)], pods[string(pod.UID)] = err, pod
		}
		if on {
			out[r.ID] = opted{owner: r.Owner, quiet: quiet, cards: cards}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.warned == nil {
		m.warned = map[string]bool{}
	}
	for uid := range m.warned {
		if _, ok := invalid[uid]; !ok {
			delete(m.warned, uid) // gone, or corrected
		}
	}
	for uid, err := range invalid {
		if m.warned[uid] {
			continue
		}
		m.warned[uid] = true
		klog.FromContext(ctx).Info("Right-sizing: invalid annotation; the pod is not right-sized", "pod", klog.KObj(pods[uid]), "err", err)
		if m.Invalid != nil {
			m.Invalid(pods[uid], err)
		}
	}
	return out
}

// Report is the AgentUseAnnotation's value: each opted-in container's last
// reading and its peak over its quiet period ("" when there is none).
func (m *Meter) Report() (string, error) {
	now := m.now()
	m.mu.Lock()
	report := &gpuinfo.UseReport{}
	for _, t := range m.tracks {
		if len(t.minutes) == 0 {
			continue
		}
		window := min(now.Sub(t.since), t.quiet)
		from := now.Add(-window).Unix() / 60
		var peak int64
		for _, p := range t.minutes {
			if p.minute >= from {
				peak = max(peak, p.mib)
			}
		}
		report.Containers = append(report.Containers, gpuinfo.ContainerUse{
			Namespace: t.owner.Namespace, Pod: t.owner.Pod, UID: t.owner.PodUID, Container: t.owner.Container,
			UseMiB: t.last, PeakMiB: max(peak, t.last), WindowSeconds: int64(max(window, 0) / time.Second),
		})
	}
	m.mu.Unlock()
	if len(report.Containers) == 0 {
		return "", nil
	}
	slices.SortFunc(report.Containers, func(a, b gpuinfo.ContainerUse) int {
		return strings.Compare(a.Namespace+"/"+a.Pod+"/"+a.Container, b.Namespace+"/"+b.Pod+"/"+b.Container)
	})
	if len(report.Containers) > MaxReported {
		report.Containers = report.Containers[:MaxReported]
	}
	return report.Encode()
}

func (m *Meter) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}
