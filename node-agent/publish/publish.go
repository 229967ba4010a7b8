// Package publish writes what the node agent knows to the API: the node's
// inventory annotation, patched only when it changes (every node write wakes
// every scheduler), and a heartbeat Lease renewed on an interval.
package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Publisher publishes one node's inventory and heartbeat.
type Publisher struct {
	Client    kubernetes.Interface
	NodeName  string
	Namespace string
	// LeaseDuration is written into the Lease for readers; the scheduler
	// applies its own timeout.
	LeaseDuration time.Duration
	// Now returns the current time; time.Now when nil.
	Now func() time.Time
	// NotReady, when set, says why the agent cannot enforce assignments now
	// ("" when it can); each heartbeat writes it on the Lease.
	NotReady func() string
	// Use, when set, is the GPU use of the node's containers opted in to
	// right-sizing (gpuinfo.AgentUseAnnotation's value, "" for none); each
	// heartbeat writes it on the Lease. A report that fails is left off.
	Use func() (string, error)
	// WithoutInventory is set when the node's cards are served as DRA
	// devices: PublishInventory then removes the inventory annotation (an
	// earlier run may have written it) instead of writing it, so that the
	// scheduler places no extended-resource pod on cards claims hold.
	WithoutInventory bool

	// leaseMu guards lease, the Lease as the last write returned it: the
	// next renewal updates it without reading it first, as kubelet renews
	// its node Lease (one request a renewal); a conflict reads it again.
	leaseMu sync.Mutex
	lease   *coordinationv1.Lease
}

// PublishInventory sets the node's inventory annotation to inv unless the
// node already carries exactly that value (or, WithoutInventory, removes
// it). It reports whether it wrote.
func (p *Publisher) PublishInventory(ctx context.Context, inv *gpuinfo.Inventory) (bool, error) {
	raw, err := inv.Encode()
	if err != nil {
		return false, fmt.Errorf("encoding the inventory: %w", err)
	}
	node, err := p.Client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading node %s: %w", p.NodeName, err)
	}
	current, ok := node.Annotations[gpuinfo.InventoryAnnotation]
	value := &raw
	switch {
	case p.WithoutInventory && !ok, !p.WithoutInventory && ok && current == raw:
		return false, nil
	case p.WithoutInventory:
		value = nil // a merge patch's null removes the annotation
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{gpuinfo.InventoryAnnotation: value}}})
	if err != nil {
		return false, err
	}
	if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return false, fmt.Errorf("patching node %s: %w", p.NodeName, err)
	}
	return true, nil
}

// LeaseName is the node's heartbeat Lease.
func (p *Publisher) LeaseName() string { return gpuinfo.AgentLeasePrefix + p.NodeName }

// Heartbeat creates or renews the node's Lease, with the agent's readiness
// (NotReady). A new Lease is owned by the Node, so it goes away with it.
func (p *Publisher) Heartbeat(ctx context.Context) error {
	notReady := ""
	if p.NotReady != nil {
		notReady = p.NotReady()
	}
	return p.heartbeat(ctx, notReady)
}

// Stopping marks the Lease not ready as the agent stops, so that the
// scheduler holds GPU pods off the node at once rather than after the
// heartbeat timeout.
func (p *Publisher) Stopping(ctx context.Context) error {
	return p.heartbeat(ctx, "node agent stopped")
}

func (p *Publisher) heartbeat(ctx context.Context, notReady string) error {
	annotations := map[string]string{gpuinfo.AgentNotReadyAnnotation: notReady, gpuinfo.AgentUseAnnotation: ""}
	if p.Use != nil {
		use, err := p.Use()
		if err != nil {
			klog.FromContext(ctx).Error(err, "GPU use report left off the heartbeat Lease: the node's pods are not right-sized meanwhile")
		}
		annotations[gpuinfo.AgentUseAnnotation] = use
	}
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	now := metav1.NewMicroTime(p.now())
	leases := p.Client.CoordinationV1().Leases(p.Namespace)
	if p.lease != nil {
		lease := p.lease.DeepCopy()
		setAnnotations(lease, annotations)
		lease.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
		if err == nil {
			p.lease = updated
			return nil
		}
		p.lease = nil // read it again: changed or deleted meanwhile
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return wrap(err, "renewing", p)
		}
	}
	lease, err := leases.Get(ctx, p.LeaseName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := p.Client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", p.NodeName, err)
		}
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: p.LeaseName(), Namespace: p.Namespace,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(p.NodeName),
				LeaseDurationSeconds: ptr.To(int32(p.LeaseDuration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		setAnnotations(lease, annotations)
		created, err := leases.Create(ctx, lease, metav1.CreateOptions{})
		if err == nil {
			p.lease = created
		}
		return wrap(err, "creating", p)
	}
	if err != nil {
		return wrap(err, "reading", p)
	}
	setAnnotations(lease, annotations)
	lease.Spec.RenewTime = &now
	lease.Spec.HolderIdentity = ptr.To(p.NodeName)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(p.LeaseDuration / time.Second))
	updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
	if err == nil {
		p.lease = updated
	}
	return wrap(err, "renewing", p)
}

// setAnnotations sets the Lease's annotations to the values given,
// removing those whose value is "".
func setAnnotations(lease *coordinationv1.Lease, values map[string]string) {
	for key, value := range values {
		if value == "" {
			delete(lease.Annotations, key)
			continue
		}
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[key] = value
	}
}

func (p *Publisher) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func wrap(err error, verb string, p *Publisher) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s lease %s/%s: %w", verb, p.Namespace, p.LeaseName(), err)
}
