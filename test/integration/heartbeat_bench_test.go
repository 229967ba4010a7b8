package integration

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/publish"
)

// countingTransport counts the requests a client sends.
type countingTransport struct {
	next     http.RoundTripper
	requests *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	return c.next.RoundTrip(r)
}

// BenchmarkHeartbeats renews the heartbeat Leases of 200 agents, each as
// its own node's agent (the shipped identity and admission policy
// tessera-agent-leases in force), and reports per renewal the requests
// sent and the CPU the whole process spent on it — API server, etcd and
// clients, all in this process — and what that comes to for 5,000 nodes
// renewing every 10 s (500 renewals a second).
func BenchmarkHeartbeats(b *testing.B) {
	const agents = 200
	ctx := context.Background()
	var requests atomic.Int64
	publishers := make([]*publish.Publisher, agents)
	for i := range publishers {
		node := fmt.Sprintf("hb-%d-%d", time.Now().UnixNano(), i)
		if _, err := cluster.CreateNode(ctx, controlPlane.Client, node, nil); err != nil {
			b.Fatal(err)
		}
		cfg := controlPlane.AgentConfig(node)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &requests} })
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		publishers[i] = &publish.Publisher{Client: client, NodeName: node, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
		if err := publishers[i].Heartbeat(ctx); err != nil { // creates the Lease
			b.Fatal(err)
		}
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	requests.Store(0)
	startCPU := cpu()
	b.ResetTimer()
	for range b.N {
		for _, p := range publishers {
			if err := p.Heartbeat(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	renewals := float64(b.N * agents)
	perRenewal := float64(cpu()-startCPU) / renewals
	b.ReportMetric(float64(requests.Load())/renewals, "requests/renewal")
	b.ReportMetric(perRenewal/1e3, "cpu-µs/renewal")
	b.ReportMetric(500*perRenewal/1e9, "cores@5000nodes")
}
