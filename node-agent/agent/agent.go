// Package agent is the node agent's main loop: it rescans the node's cards,
// publishes the inventory when it changes, and renews the heartbeat Lease.
package agent

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/health"
	"github.com/tessera-gpu/tessera/node-agent/publish"
)

// Agent runs discovery and publishing for one node.
type Agent struct {
	Backend discovery.Backend
	// Health, when set, holds cards out of service after trouble until they
	// have been quiet for its period.
	Health *health.Tracker
	// Devices, when set, is told the cards after every scan (the device
	// plugin advertising them to kubelet).
	Devices interface{ Update([]discovery.Card) }
	// Enforcement, when set, is the NRI plugin: its readiness goes on the
	// heartbeat Lease at once when it changes, and a lasting loss is told
	// on the Node as an Event.
	Enforcement       Enforcement
	Publisher         *publish.Publisher
	RescanInterval    time.Duration
	HeartbeatInterval time.Duration

	// warned records that the Node carries an unrecovered
	// GPUEnforcementUnavailable Event.
	warned bool
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
	a.rescan(ctx)
	// The first heartbeat may find enforcement still connecting: it tells
	// the scheduler, but is not worth an Event.
	a.heartbeat(ctx)
	defer a.stopping(ctx)
	// A critical XID publishes the card's new health at once.
	xids := make(chan struct{}, 1)
	if watcher, ok := a.Backend.(discovery.XIDWatcher); ok && a.Health != nil {
		go func() {
			err := watcher.WatchXIDs(ctx, func(uuid string, xid uint64) {
				critical := a.Health.ObserveXID(uuid, xid)
				logger.Info("GPU XID error", "uuid", uuid, "xid", xid, "critical", critical)
				if critical {
					select {
					case xids <- struct{}{}:
					default:
					}
				}
			})
			if err != nil {
				logger.Error(err, "Not watching XID events; card health comes from each scan only")
			}
		}()
	}
	rescan := time.NewTicker(a.RescanInterval)
	defer rescan.Stop()
	beat := time.NewTicker(a.HeartbeatInterval)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			logger.Info("Node agent stopping", "node", a.Publisher.NodeName)
			return
		case <-rescan.C:
			a.rescan(ctx)
		case <-xids:
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

// scan reads the cards, applies their health and publishes the inventory.
func (a *Agent) scan(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cards, err := a.Backend.Cards()
	if err != nil {
		return fmt.Errorf("scanning GPUs: %w", err)
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
	if a.Devices != nil {
		a.Devices.Update(cards)
	}
	changed, err := a.Publisher.PublishInventory(ctx, discovery.Inventory(cards))
	if err != nil {
		return err
	}
	if changed {
		logger.Info("Published GPU inventory", "cards", len(cards))
	}
	return nil
}

func (a *Agent) rescan(ctx context.Context) {
	if err := a.scan(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Keeping the published GPU inventory")
	}
}

func (a *Agent) heartbeat(ctx context.Context) {
	if err := a.Publisher.Heartbeat(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Renewing the heartbeat lease failed")
	}
}
