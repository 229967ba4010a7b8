package gpushare

import (
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// heartbeats follows the node agents' Leases. A node whose agent has not
// renewed its Lease within the timeout, or says on it that it cannot enforce
// assignments (gpuinfo.AgentNotReadyAnnotation), gets no new GPU pods; the
// pods kept off it are activated as soon as the agent reports again, not
// after the scheduler's unschedulable timeout. A node with a GPU inventory
// but no Lease counts as not reporting: its agent never started, or its
// Lease was deleted. Renewals are timed by the scheduler's clock, when it
// sees them.
type heartbeats struct {
	// records hold each agent's last renewal and reason for not being
	// ready, beside what Filter keeps per node.
	records   nodeRecords
	activator fwk.PodActivator
	logger    klog.Logger

	mu      sync.Mutex
	waiting map[string]map[types.UID]*v1.Pod // node -> pods rejected for its silent agent
}

// silence says whether the node's agent is not reporting — its Lease
// renewed longer than timeout ago, or none for a node with a GPU inventory —
// and how: "for <age>", or "no heartbeat Lease".
func (hb *heartbeats) silence(node *v1.Node, timeout time.Duration) (string, bool) {
	var renewed int64
	if rec := hb.records.get(node.Name); rec != nil {
		renewed = rec.renewed.Load()
	}
	if renewed == 0 {
		return "no heartbeat Lease", hasInventory(node)
	}
	age := time.Since(time.Unix(0, renewed))
	return "for " + age.Round(time.Second).String(), age > timeout
}

// hasInventory reports whether the node carries a GPU inventory: a node its
// agent published (and must keep reporting on).
func hasInventory(node *v1.Node) bool {
	_, ok := node.Annotations[gpuinfo.InventoryAnnotation]
	return ok
}

// unready returns the reason the node's agent gives for not enforcing
// assignments, if it gives one.
func (hb *heartbeats) unready(node string) (string, bool) {
	rec := hb.records.get(node)
	if rec == nil {
		return "", false
	}
	if reason := rec.notReady.Load(); reason != nil {
		return *reason, true
	}
	return "", false
}

// wait remembers a pod kept off node, to activate it when the agent reports.
func (hb *heartbeats) wait(node string, pod *v1.Pod) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.waiting == nil {
		hb.waiting = map[string]map[types.UID]*v1.Pod{}
	}
	if hb.waiting[node] == nil {
		hb.waiting[node] = map[types.UID]*v1.Pod{}
	}
	hb.waiting[node][pod.UID] = pod
}

// forget drops a deleted pod from every node's waiting list.
func (hb *heartbeats) forget(uid types.UID) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	for node, pods := range hb.waiting {
		delete(pods, uid)
		if len(pods) == 0 {
			delete(hb.waiting, node)
		}
	}
}

// activate moves the pods waiting on node back to the active queue.
func (hb *heartbeats) activate(node string) {
	hb.mu.Lock()
	pods := hb.waiting[node]
	delete(hb.waiting, node)
	hb.mu.Unlock()
	if len(pods) == 0 || hb.activator == nil {
		return
	}
	batch := make(map[string]*v1.Pod, len(pods))
	for _, p := range pods {
		batch[p.Namespace+"/"+p.Name] = p
	}
	hb.logger.V(3).Info("GPU agent reports again; retrying pods kept off its node", "node", node, "pods", len(batch))
	hb.activator.Activate(hb.logger, batch)
}

func (hb *heartbeats) onLease(obj any) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	node, ok := strings.CutPrefix(lease.Name, gpuinfo.AgentLeasePrefix)
	if !ok || lease.Spec.RenewTime == nil {
		return
	}
	rec := hb.records.ensure(node)
	renewTime, now := lease.Spec.RenewTime.UnixNano(), time.Now().UnixNano()
	switch previous := rec.leaseRenewTime.Swap(renewTime); {
	case previous == 0:
		// First seen (the scheduler starting): the agent's own time, but
		// never later than now, so a stale Lease counts as stale.
		rec.renewed.Store(min(renewTime, now))
	case previous != renewTime:
		rec.renewed.Store(now)
	}
	if reason, ok := lease.Annotations[gpuinfo.AgentNotReadyAnnotation]; ok {
		if len(reason) > gpuinfo.MaxNotReadyReason {
			reason = reason[:gpuinfo.MaxNotReadyReason] + "..."
		}
		rec.notReady.Store(&reason)
		return
	}
	rec.notReady.Store(nil)
	hb.activate(node)
}

func (hb *heartbeats) onLeaseDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if lease, ok := obj.(*coordinationv1.Lease); ok {
		if node, ok := strings.CutPrefix(lease.Name, gpuinfo.AgentLeasePrefix); ok {
			hb.records.leaseDeleted(node)
			hb.activate(node)
		}
	}
}
