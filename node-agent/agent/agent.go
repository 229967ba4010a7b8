// Package agent is the node agent's main loop: it rescans the node's cards,
// publishes the inventory when it changes, and renews the heartbeat Lease.
package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/health"
	"github.com/tessera-gpu/tessera/node-agent/migslices"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Agent runs discovery and publishing for one node.
type Agent struct {
	Backend discovery.Backend
	// Health, when set, holds cards out of service after trouble until they
	// have been quiet for its period.
	Health *health.Tracker
	// Devices are told the cards after every scan: the device plugin
	// advertising them to kubelet or the DRA driver publishing them as
	// ResourceSlice devices, and the NRI plugin checking assignments
	// against them.
	Devices []CardWatcher
	// Metrics, when set, is told the cards after every scan, with the health
	// published, and every XID error seen, critical or not.
	Metrics Metrics
	// Enforcement, when set, is the NRI plugin: its readiness goes on the
	// heartbeat Lease at once when it changes, and a lasting loss is told
	// on the Node as an Event.
	Enforcement Enforcement
	Publisher   *publish.Publisher
	// InventoryVersion is the newest inventory version published (0: the
	// newest this release writes): version 2 only where cards in MIG mode
	// need it, 1 elsewhere (discovery.Inventory).
	InventoryVersion int
	// DynamicMIG, when set, reports the cards in MIG mode whose slices
	// Tessera makes as pods need them (--dynamic-mig-cards); the simulated
	// backend marks its own.
	DynamicMIG func(index int) bool
	// Slices, when set, cuts the dynamic cards into the slices their pods
	// hold before each scan is published, and asks for a scan when a pod
	// on the node changes.
	Slices *migslices.Manager
	// SliceSpec, when set, is told the cards after each scan, to keep the
	// CDI spec of the dynamic cards' slices current
	// (enforce.MIGSpecWriter.Write).
	SliceSpec         func(cards []discovery.Card) error
	RescanInterval    time.Duration
	HeartbeatInterval time.Duration

	// warned records that the Node carries an unrecovered
	// GPUEnforcementUnavailable Event.
	warned bool
	// lastCards is the last scan that succeeded: when a scan fails, these
	// cards are published unhealthy.
	lastCards []discovery.Card
	// xids watches the cards' XID events (see watchXIDs).
	xids xidWatch
	// turned is when Run's loop last finished a turn (UnixNano; 0 before
	// Run), beat when a heartbeat last succeeded, scanned whether a scan
	// has been published: what Live and Ready read, from other goroutines.
	turned, beat atomic.Int64
	scanned      atomic.Bool
}

// xidWatch is the XID event watch of the cards it started with.
type xidWatch struct {
	cards   string // the UUIDs watched, in order
	cancel  context.CancelFunc
	stopped chan struct{}
	events  chan struct{} // a critical XID arrived
}

// CardWatcher is told the node's cards after every scan.
type CardWatcher interface{ Update([]discovery.Card) }

// Metrics records what the agent sees for its metrics.
type Metrics interface {
	Update([]discovery.Card)
	ObserveXID(uuid string, xid uint64)
}

// Enforcement says whether assignments can be enforced now.
type Enforcement interface {
	// NotReady says why not, or "" when they can.
	NotReady() string
	// Changes is signalled when NotReady's answer may have changed.
	Changes() <-chan struct{}
}

// Run publishes at once, then on every interval, until ctx ends. Errors are
// logged and retried on the next tick; a failing API server never stops the
// agent.
func (a *Agent) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.Info("Node agent starting", "node", a.Publisher.NodeName, "backend", a.Backend.Name())
	var enforcement <-chan struct{}
	if a.Enforcement != nil {
		a.Publisher.NotReady = a.Enforcement.NotReady
		enforcement = a.Enforcement.Changes()
	}
	a.xids.events = make(chan struct{}, 1)
	defer a.stopXIDs()
	a.turned.Store(time.Now().UnixNano())
	a.rescan(ctx)
	// The first heartbeat may find enforcement still connecting: it tells
	// the scheduler, but is not worth an Event.
	a.heartbeat(ctx)
	defer a.stopping(ctx)
	rescan := time.NewTicker(a.RescanInterval)
	defer rescan.Stop()
	var slicesWanted <-chan struct{}
	if a.Slices != nil {
		slicesWanted = a.Slices.Changes()
	}
	beat := time.NewTicker(a.HeartbeatInterval)
	defer beat.Stop()
	for {
		a.turned.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			logger.Info("Node agent stopping", "node", a.Publisher.NodeName)
			return
		case <-rescan.C:
			a.rescan(ctx)
		case <-a.xids.events:
			a.rescan(ctx)
		case <-slicesWanted:
			a.rescan(ctx)
		case <-beat.C:
			a.heartbeat(ctx)
			a.reportEnforcement(ctx)
		case <-enforcement:
			a.heartbeat(ctx)
			a.reportEnforcement(ctx)
		}
	}
}

// reportEnforcement records an Event on the Node when enforcement is lost,
// and another when it is back.
func (a *Agent) reportEnforcement(ctx context.Context) {
	if a.Enforcement == nil {
		return
	}
	notReady := a.Enforcement.NotReady()
	if (notReady != "") == a.warned {
		return
	}
	if err := a.Publisher.ReportEnforcement(ctx, notReady); err != nil {
		klog.FromContext(ctx).Error(err, "Recording the enforcement state on the node failed")
		return
	}
	a.warned = notReady != ""
}

// stopping marks the Lease not ready as the agent stops.
func (a *Agent) stopping(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.Publisher.Stopping(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Marking the heartbeat lease stopped failed")
	}
}

// Once scans and publishes one time; for tests and tools.
func (a *Agent) Once(ctx context.Context) error {
	if err := a.scan(ctx); err != nil {
		return err
	}
	return a.Publisher.Heartbeat(ctx)
}

// ServeSlices makes the agent cut its dynamic cards with controller: a pod
// whose slice cannot be made is marked Failed, with an Event saying why. The
// manager returned still needs the node's pods (migslices.Manager.SetPods).
func (a *Agent) ServeSlices(ctx context.Context, controller discovery.MIGController) *migslices.Manager {
	a.Slices = migslices.New(controller, func(pod *v1.Pod, why string) {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := a.Publisher.FailPod(ctx, pod, why); err != nil {
				klog.FromContext(ctx).Error(err, "Failing the pod whose MIG slice could not be made failed", "pod", klog.KObj(pod))
			}
		}()
	})
	return a.Slices
}

// newestInventory is the newest inventory version the agent publishes.
func (a *Agent) newestInventory() int {
	if a.InventoryVersion == 0 {
		return gpuinfo.InventoryVersion
	}
	return a.InventoryVersion
}

// cutSlices marks the dynamic cards and, with Slices, makes and unmakes
// their slices as the node's pods need, returning the cards as they are
// then.
func (a *Agent) cutSlices(ctx context.Context, cards []discovery.Card) []discovery.Card {
	mark := func(cards []discovery.Card) []discovery.Card {
		for i := range cards {
			if a.DynamicMIG != nil && cards[i].MIGEnabled && a.DynamicMIG(cards[i].Index) {
				cards[i].MIGDynamic = true
			}
		}
		return cards
	}
	cards = mark(cards)
	if a.Slices == nil || !a.Slices.Reconcile(ctx, cards) {
		return cards
	}
	again, err := a.Backend.Cards()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the cards again after changing their MIG slices failed")
		return cards
	}
	return mark(again)
}

// scan reads the cards, applies their health and publishes the inventory.
// When the backend cannot read the cards, the last ones it read are
// published unhealthy (and the error returned): no new work goes to cards
// nobody can see, and a card an XID marked stays marked.
func (a *Agent) scan(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cards, scanErr := a.Backend.Cards()
	if scanErr != nil {
		scanErr = fmt.Errorf("scanning GPUs: %w", scanErr)
		if a.lastCards == nil {
			return scanErr
		}
		cards = slices.Clone(a.lastCards)
		for i := range cards {
			cards[i].Healthy = false
		}
	} else {
		cards = a.cutSlices(ctx, cards)
		a.lastCards = slices.Clone(cards)
		if a.SliceSpec != nil {
			if err := a.SliceSpec(cards); err != nil {
				logger.Error(err, "Writing the CDI spec of the dynamic cards' MIG slices failed: containers given a slice made since are refused by the runtime until it is written")
			}
		}
	}
	if a.Health != nil {
		for _, t := range a.Health.Apply(cards) {
			logger.Info("GPU health changed", "uuid", t.UUID, "healthy", t.Healthy, "reason", t.Reason)
			if !t.Healthy {
				if n, err := a.Publisher.ReportUnhealthyCard(ctx, t.UUID, t.Reason); err != nil {
					logger.Error(err, "Telling the card's pods failed", "uuid", t.UUID)
				} else if n > 0 {
					logger.Info("Told the pods on the unhealthy card", "uuid", t.UUID, "pods", n)
				}
			}
		}
	}
	for _, d := range a.Devices {
		d.Update(cards)
	}
	if a.Metrics != nil {
		a.Metrics.Update(cards)
	}
	changed, err := a.Publisher.PublishInventory(ctx, discovery.Inventory(cards, a.newestInventory()))
	if err != nil {
		return errors.Join(scanErr, err)
	}
	if changed && a.Publisher.WithoutInventory {
		logger.Info("Removed the GPU inventory annotation: the cards are served as DRA devices")
	} else if changed {
		logger.Info("Published GPU inventory", "cards", len(cards))
	}
	if scanErr == nil {
		a.watchXIDs(ctx, cards)
	}
	return scanErr
}

// watchXIDs (re)starts the XID event watch when the cards differ from those
// it watches, or when it has stopped (NVML failed, or was initialised
// again): a new card is watched from the next scan on.
func (a *Agent) watchXIDs(ctx context.Context, cards []discovery.Card) {
	watcher, ok := a.Backend.(discovery.XIDWatcher)
	if !ok || a.Health == nil || len(cards) == 0 {
		return
	}
	uuids := make([]string, len(cards))
	for i, c := range cards {
		uuids[i] = c.UUID
	}
	key := strings.Join(uuids, ",")
	if a.xids.cancel != nil {
		select {
		case <-a.xids.stopped:
		default:
			if a.xids.cards == key {
				return
			}
		}
	}
	a.stopXIDs()
	logger := klog.FromContext(ctx)
	watchCtx, cancel := context.WithCancel(ctx)
	stopped, events, metrics := make(chan struct{}), a.xids.events, a.Metrics
	a.xids.cards, a.xids.cancel, a.xids.stopped = key, cancel, stopped
	go func() {
		defer close(stopped)
		err := watcher.WatchXIDs(watchCtx, func(uuid string, xid uint64) {
			if metrics != nil {
				metrics.ObserveXID(uuid, xid)
			}
			critical := a.Health.ObserveXID(uuid, xid)
			logger.Info("GPU XID error", "uuid", uuid, "xid", xid, "critical", critical)
			if critical {
				select {
				case events <- struct{}{}:
				default:
				}
			}
		})
		if err != nil && watchCtx.Err() == nil {
			logger.Error(err, "Not watching XID events until the next scan; card health comes from the scans")
		}
	}()
}

// stopXIDs ends the XID watch, if one runs, and waits for it.
func (a *Agent) stopXIDs() {
	if a.xids.cancel == nil {
		return
	}
	a.xids.cancel()
	<-a.xids.stopped
	a.xids.cancel = nil
}

func (a *Agent) rescan(ctx context.Context) {
	if err := a.scan(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Keeping the published GPU inventory")
		return
	}
	a.scanned.Store(true)
}

func (a *Agent) heartbeat(ctx context.Context) {
	if err := a.Publisher.Heartbeat(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Renewing the heartbeat lease failed")
		return
	}
	a.beat.Store(time.Now().UnixNano())
}

// liveTurns is how many of its longest interval Run's loop may take for a
// turn before the agent counts as hung.
const liveTurns = 3

// Live is nil while Run's loop turns: it wakes at least every
// HeartbeatInterval, so a loop that has not turned for liveTurns times the
// longer of the two intervals is stuck (in a card scan NVML does not
// answer, say). Nothing outside the process counts: neither an API server
// nor a container runtime that is down makes the agent dead, or a restart
// would follow every outage.
func (a *Agent) Live() error {
	turned := a.turned.Load()
	if turned == 0 {
		return nil // Run has not started: the probe's initial delay covers start-up
	}
	window := liveTurns * max(a.HeartbeatInterval, a.RescanInterval)
	if since := time.Since(time.Unix(0, turned)); since > window {
		return fmt.Errorf("the agent's loop has not turned for %v (more than %v)", since.Round(time.Second), window)
	}
	return nil
}

// Ready is nil when the node can take GPU pods from this agent: its cards
// were scanned and published, its last heartbeat is fresh (within two
// intervals), and enforcement is ready (connected to the runtime's NRI,
// pod cache synced).
func (a *Agent) Ready() error {
	if !a.scanned.Load() {
		return errors.New("no scan of the cards published yet")
	}
	beat := a.beat.Load()
	if beat == 0 {
		return errors.New("no heartbeat renewed yet")
	}
	if since := time.Since(time.Unix(0, beat)); since > 2*a.HeartbeatInterval {
		return fmt.Errorf("the last heartbeat was renewed %v ago", since.Round(time.Second))
	}
	if a.Enforcement != nil {
		if reason := a.Enforcement.NotReady(); reason != "" {
			return fmt.Errorf("assignments are not enforced: %s", reason)
		}
	}
	return nil
}
