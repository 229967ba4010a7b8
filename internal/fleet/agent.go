package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Defaults of the scheduler's plugin arguments agentNamespace and
// agentHeartbeatTimeout.
const (
	AgentNamespace   = "tessera-system"
	HeartbeatTimeout = 40 * time.Second
)

// Agent is what a node agent's heartbeat Lease says.
type Agent struct {
	// Lease reports whether the node has a heartbeat Lease; a node without
	// one is judged by its inventory alone.
	Lease bool
	// Renewed is the Lease's last renewal.
	Renewed time.Time
	// NotReady is the reason the agent gives for not enforcing assignments,
	// "" when it gives none.
	NotReady string
	// HasNotReady reports whether the Lease carries the not-ready annotation.
	HasNotReady bool
}

// Agents lists the agents' heartbeat Leases in namespace, by node name.
func Agents(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]Agent, error) {
	leases, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the node agents' Leases in %s: %w", namespace, err)
	}
	agents := map[string]Agent{}
	for _, l := range leases.Items {
		node, ok := strings.CutPrefix(l.Name, gpuinfo.AgentLeasePrefix)
		if !ok || l.Spec.RenewTime == nil {
			continue
		}
		a := Agent{Lease: true, Renewed: l.Spec.RenewTime.Time}
		a.NotReady, a.HasNotReady = l.Annotations[gpuinfo.AgentNotReadyAnnotation]
		agents[node] = a
	}
	return agents, nil
}

// Blocked returns why the scheduler places no GPU pod on node because of
// its agent — silent for longer than timeout, or not ready — as a short
// state ("agent silent", "agent not ready") and a message naming the node
// and the age or the agent's reason; both are "" when the agent does not
// keep pods off the node.
func (a Agent) Blocked(node string, now time.Time, timeout time.Duration) (state, message string) {
	if !a.Lease {
		return "", ""
	}
	if age := now.Sub(a.Renewed); timeout > 0 && age > timeout {
		return "agent silent", "GPU agent on node " + node + " not reporting for " + age.Round(time.Second).String()
	}
	if a.HasNotReady {
		reason := a.NotReady
		if len(reason) > gpuinfo.MaxNotReadyReason {
			reason = reason[:gpuinfo.MaxNotReadyReason] + "..."
		}
		return "agent not ready", "GPU agent on node " + node + " cannot enforce GPU assignments: " + reason
	}
	return "", ""
}
