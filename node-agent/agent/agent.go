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
	Devices           interface{ Update([]discovery.Card) }
	Publisher         *publish.Publisher
	RescanInterval    time.Duration
	HeartbeatInterval time.Duration
}

// Run publishes at once, then on every interval, until ctx ends. Errors are
// logged and retried on the next tick; a failing API server never stops the
// agent.
func (a *Agent) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.Info("Node agent starting", "node", a.Publisher.NodeName, "backend", a.Backend.Name())
	a.rescan(ctx)
	a.heartbeat(ctx)
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
		}
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
