// Package agent is the node agent's main loop: it rescans the node's cards,
// publishes the inventory when it changes, and renews the heartbeat Lease.
package agent

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/publish"
)

// Agent runs discovery and publishing for one node.
type Agent struct {
	Backend           discovery.Backend
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
		case <-beat.C:
			a.heartbeat(ctx)
		}
	}
}

// Once scans and publishes one time; for tests and tools.
func (a *Agent) Once(ctx context.Context) error {
	cards, err := a.Backend.Cards()
	if err != nil {
		return err
	}
	if _, err := a.Publisher.PublishInventory(ctx, discovery.Inventory(cards)); err != nil {
		return err
	}
	return a.Publisher.Heartbeat(ctx)
}

func (a *Agent) rescan(ctx context.Context) {
	logger := klog.FromContext(ctx)
	cards, err := a.Backend.Cards()
	if err != nil {
		logger.Error(err, "Scanning GPUs failed; keeping the published inventory")
		return
	}
	changed, err := a.Publisher.PublishInventory(ctx, discovery.Inventory(cards))
	switch {
	case err != nil:
		logger.Error(err, "Publishing the GPU inventory failed")
	case changed:
		logger.Info("Published GPU inventory", "cards", len(cards))
	}
}

func (a *Agent) heartbeat(ctx context.Context) {
	if err := a.Publisher.Heartbeat(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Renewing the heartbeat lease failed")
	}
}
