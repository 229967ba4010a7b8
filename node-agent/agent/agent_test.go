package agent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/health"
	"github.com/tessera-gpu/tessera/node-agent/metrics"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// xidBackend is a simulated backend whose XID watch reports the given
// errors, then waits for its end.
type xidBackend struct {
	*discovery.Simulated
	xids []uint64
}

func (b xidBackend) WatchXIDs(ctx context.Context, report func(uuid string, xid uint64)) error {
	cards, _ := b.Cards()
	for _, xid := range b.xids {
		report(cards[0].UUID, xid)
	}
	<-ctx.Done()
	return nil
}

// TestMetricsSeeScansAndXIDs: the metrics get every XID the watch reports,
// critical or not, and each card's health as the agent publishes it.
func TestMetricsSeeScansAndXIDs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sim, err := discovery.NewSimulated("node-1", "2xL4-24GB")
	if err != nil {
		t.Fatal(err)
	}
	collector := metrics.New("node-1", sim)
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	a := &Agent{
		Backend:   xidBackend{sim, []uint64{13, 79}}, // 13 is the application's, 79 the card's
		Health:    health.NewTracker(time.Hour, time.Now),
		Metrics:   collector,
		Publisher: &publish.Publisher{Client: client, NodeName: "node-1", Namespace: "tessera-system", LeaseDuration: time.Minute},
	}
	a.xids.events = make(chan struct{}, 1)
	defer a.stopXIDs()
	if err := a.scan(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.xids.events: // XID 79, after 13
	case <-time.After(10 * time.Second):
		t.Fatal("no critical XID reported")
	}
	if err := a.scan(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testutil.CollectAndCompare(collector, strings.NewReader(`
# HELP tessera_agent_card_healthy 1 when the agent publishes the card healthy, 0 when it holds it out of service.
# TYPE tessera_agent_card_healthy gauge
tessera_agent_card_healthy{card="0",node="node-1"} 0
tessera_agent_card_healthy{card="1",node="node-1"} 1
# HELP tessera_agent_card_xid_errors_total XID errors the card raised since the agent started, by XID (critical or not).
# TYPE tessera_agent_card_xid_errors_total counter
tessera_agent_card_xid_errors_total{card="0",node="node-1",xid="13"} 1
tessera_agent_card_xid_errors_total{card="0",node="node-1",xid="79"} 1
`), "tessera_agent_card_healthy", "tessera_agent_card_xid_errors_total"); err != nil {
		t.Error(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inv := node.Annotations[gpuinfo.InventoryAnnotation]; strings.Count(inv, `"healthy":false`) != 1 {
		t.Errorf("published inventory %s, want card 0 unhealthy as in the metrics", inv)
	}
}

// switchable is an Enforcement whose readiness the test sets.
type switchable struct {
	mu     sync.Mutex
	reason string
}

func (s *switchable) NotReady() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

func (s *switchable) set(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reason = reason
}

func (s *switchable) Changes() <-chan struct{} { return nil }

// hangingBackend is a simulated backend whose card scans block while hang
// is set: NVML that stopped answering.
type hangingBackend struct {
	*discovery.Simulated
	hang atomic.Bool
}

func (b *hangingBackend) Cards() ([]discovery.Card, error) {
	for b.hang.Load() {
		time.Sleep(time.Millisecond)
	}
	return b.Simulated.Cards()
}

// TestProbes: the agent is ready once its cards are published, its
// heartbeat fresh and enforcement ready, and not while any is missing; it
// stays alive through an API server that refuses its heartbeats and
// enforcement that is down, and is dead once its loop stops turning.
func TestProbes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sim, err := discovery.NewSimulated("node-1", "1xL4-24GB")
	if err != nil {
		t.Fatal(err)
	}
	backend := &hangingBackend{Simulated: sim}
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	var refuseLeases atomic.Bool
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuseLeases.Load() {
			return true, nil, errors.New("the API server is down")
		}
		return false, nil, nil
	})
	enforcement := &switchable{}
	a := &Agent{
		Backend:           backend,
		Enforcement:       enforcement,
		Publisher:         &publish.Publisher{Client: client, NodeName: "node-1", Namespace: "tessera-system", LeaseDuration: time.Minute},
		RescanInterval:    20 * time.Millisecond,
		HeartbeatInterval: 20 * time.Millisecond,
	}
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "no scan") {
		t.Errorf("Ready before Run = %v, want no scan yet", err)
	}
	if err := a.Live(); err != nil {
		t.Errorf("Live before Run = %v, want nil (start-up)", err)
	}
	go a.Run(ctx)
	waitProbe(t, "ready", a.Ready, "")

	enforcement.set("NRI plugin not connected")
	waitProbe(t, "not ready without enforcement", a.Ready, "not enforced: NRI plugin not connected")
	if err := a.Live(); err != nil {
		t.Errorf("Live without enforcement = %v, want nil", err)
	}
	enforcement.set("")
	waitProbe(t, "ready again", a.Ready, "")

	refuseLeases.Store(true)
	waitProbe(t, "not ready without heartbeats", a.Ready, "heartbeat")
	if err := a.Live(); err != nil {
		t.Errorf("Live with the API server down = %v, want nil", err)
	}
	refuseLeases.Store(false)
	waitProbe(t, "ready after the API server is back", a.Ready, "")

	backend.hang.Store(true)
	defer backend.hang.Store(false)
	waitProbe(t, "dead with its loop stuck in a scan", a.Live, "has not turned")
}

// waitProbe waits up to 10 s for probe to answer nil (want "") or an error
// containing want.
func waitProbe(t *testing.T, what string, probe func() error, want string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		err = probe()
		if (want == "" && err == nil) || (want != "" && err != nil && strings.Contains(err.Error(), want)) {
			return
		}
	}
	t.Fatalf("%s: the probe answers %v, want %q", what, err, want)
}
