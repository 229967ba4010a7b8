package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

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
