// Package migslices makes and unmakes the MIG slices of a node's dynamic
// cards. The scheduler chooses each slice's profile and placement and
// records them in the assignment of the pod it places there; the node agent
// creates the slice once a pod bound to its node holds it, and destroys a
// slice once no pod does. Creation takes seconds, so it happens here, when
// the pod appears on the node, not in NRI's CreateContainer (which the
// runtime times out after 2 s): a container whose slice does not exist yet
// is refused, and kubelet retries it.
package migslices

import (
	"context"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Manager keeps a node's dynamic cards cut into the slices its pods hold.
type Manager struct {
	// Controller creates and destroys slices.
	Controller discovery.MIGController
	// Failed is told each pod whose slice could not be created, and why.
	Failed func(pod *v1.Pod, reason string)

	mu   sync.Mutex
	pods func() ([]*v1.Pod, error)
	wake chan struct{}
}

// New returns a manager of the slices of controller's dynamic cards;
// failed is told the pods whose slices could not be made.
func New(controller discovery.MIGController, failed func(pod *v1.Pod, reason string)) *Manager {
	return &Manager{Controller: controller, Failed: failed, wake: make(chan struct{}, 1)}
}

// SetPods gives the manager the pods bound to the node that have not
// finished, once the pod cache has synced: until then it neither creates
// nor destroys anything.
func (m *Manager) SetPods(list func() ([]*v1.Pod, error)) {
	m.mu.Lock()
	m.pods = list
	m.mu.Unlock()
	m.Wake()
}

// Wake asks for a reconciliation soon: a pod on the node changed.
func (m *Manager) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// PodChanged wakes the manager for a pod of the node that changed, if its
// assignment gives a MIG slice (or the pod is not known: nil).
func (m *Manager) PodChanged(pod *v1.Pod) {
	if pod == nil {
		m.Wake()
		return
	}
	a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
	if err == nil && a.NeededVersion() == gpuinfo.AssignmentVersion2 {
		m.Wake()
	}
}

// Changes delivers Wake's requests.
func (m *Manager) Changes() <-chan struct{} { return m.wake }

// slice names a slice on the node: card index, profile and start slot.
type slice struct {
	card    int
	profile string
	start   int
}

// String names the slice in logs.
func (s slice) String() string {
	return fmt.Sprintf("card %d, MIG %s at slot %d", s.card, s.profile, s.start)
}

// Reconcile destroys the slices of the dynamic cards that no pod holds, then
// creates those that pods hold and the cards lack. It returns whether it
// changed any card (the cards should be read again).
func (m *Manager) Reconcile(ctx context.Context, cards []discovery.Card) (changed bool) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	list := m.pods
	m.mu.Unlock()
	if list == nil {
		return false
	}
	pods, err := list()
	if err != nil {
		logger.Error(err, "Listing the node's pods for its MIG slices failed")
		return false
	}
	want := wanted(cards, pods)
	for _, s := range existing(cards) {
		if _, held := want[s]; held {
			continue
		}
		if err := m.Controller.DestroyMIGSlice(s.card, s.profile, s.start); err != nil {
			logger.Error(err, "Destroying a MIG slice no pod holds failed", "slice", s)
			continue
		}
		logger.Info("Destroyed a MIG slice no pod holds", "slice", s)
		changed = true
	}
	have := map[slice]bool{}
	for _, s := range existing(cards) {
		have[s] = true
	}
	for _, s := range sortedSlices(want) {
		if have[s] {
			continue
		}
		uuid, err := m.Controller.CreateMIGSlice(s.card, s.profile, s.start)
		if err != nil {
			logger.Error(err, "Creating a MIG slice failed", "slice", s)
			for _, pod := range want[s] {
				m.Failed(pod, fmt.Sprintf("creating its MIG slice (%s) failed: %v", s, err))
			}
			continue
		}
		logger.Info("Created a MIG slice", "slice", s, "uuid", uuid, "pods", klog.KObjSlice(want[s]))
		changed = true
	}
	return changed
}

// wanted returns the slices of dynamic cards that the pods hold, with the
// pods holding each: pods that have not finished, by their assignments'
// entries naming a dynamic card of this node as it is now.
func wanted(cards []discovery.Card, pods []*v1.Pod) map[slice][]*v1.Pod {
	dynamic := map[int]string{}
	for _, c := range cards {
		if c.MIGDynamic && c.MIG != nil {
			dynamic[c.Index] = c.UUID
		}
	}
	want := map[slice][]*v1.Pod{}
	for _, pod := range pods {
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			continue
		}
		for _, entries := range a.Containers {
			for _, e := range entries {
				if uuid, ok := dynamic[e.Index]; ok && e.MIG != nil && e.UUID == uuid {
					s := slice{e.Index, e.MIG.Profile, e.MIG.Start}
					if holders := want[s]; len(holders) == 0 || holders[len(holders)-1] != pod {
						want[s] = append(holders, pod)
					}
				}
			}
		}
	}
	return want
}

// existing returns the slices the dynamic cards have now.
func existing(cards []discovery.Card) []slice {
	var have []slice
	for _, c := range cards {
		if !c.MIGDynamic || c.MIG == nil {
			continue
		}
		for _, in := range c.MIG.Instances {
			have = append(have, slice{c.Index, in.Profile, in.Start})
		}
	}
	return have
}

// sortedSlices lists want's slices in a fixed order, so that failures are
// reported the same way every time.
func sortedSlices(want map[slice][]*v1.Pod) []slice {
	out := make([]slice, 0, len(want))
	for s := range want {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.card != b.card {
			return a.card < b.card
		}
		return a.start < b.start
	})
	return out
}
