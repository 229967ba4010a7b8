package schedulercmd

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/internal/version"
)

// memoryLock is a leader-election lock held in memory: the elector under
// test is the only candidate. Get answers NotFound until the first Create.
type memoryLock struct {
	mu     sync.Mutex
	record *resourcelock.LeaderElectionRecord
}

func (l *memoryLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.record == nil {
		return nil, nil, apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "tessera-scheduler")
	}
	r := *l.record
	return &r, []byte(r.HolderIdentity), nil
}

func (l *memoryLock) Create(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.record = &r
	return nil
}

func (l *memoryLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.Create(ctx, r)
}

func (l *memoryLock) RecordEvent(string) {}
func (l *memoryLock) Identity() string   { return "replica-0" }
func (l *memoryLock) Describe() string   { return "memory/tessera-scheduler" }

// TestLeaderElectionMetric: a replica that leads reports
// leader_election_master_status{name="tessera-scheduler"} 1, as the alert
// TesseraSchedulerNoLeader expects. Without client-go's metrics registered
// the elector reports nothing.
func TestLeaderElectionMetric(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leading := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          &memoryLock{},
		Name:          "tessera-scheduler",
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(leading) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go elector.Run(ctx)
	select {
	case <-leading:
	case <-time.After(30 * time.Second):
		t.Fatal("the only candidate did not lead within 30s")
	}
	if got, ok := gauge(t, "leader_election_master_status", "name", "tessera-scheduler"); !ok || got != 1 {
		t.Errorf("leader_election_master_status{name=\"tessera-scheduler\"} = %v (served: %t), want 1", got, ok)
	}
}

// TestBuildInfoMetric: the scheduler serves kubernetes_build_info.
func TestBuildInfoMetric(t *testing.T) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kubernetes_build_info" {
			return
		}
	}
	t.Error("kubernetes_build_info is not served")
}

// TestTesseraBuildInfo: the scheduler serves Tessera's own version, not only
// kube-scheduler's.
func TestTesseraBuildInfo(t *testing.T) {
	if got, ok := gauge(t, "tessera_build_info", "version", version.Version); !ok || got != 1 {
		t.Errorf("tessera_build_info{version=%q} = %v (served: %t), want 1", version.Version, got, ok)
	}
}

// TestJSONLogFormat: --logging-format=json is a format the scheduler knows.
func TestJSONLogFormat(t *testing.T) {
	c := logsapi.NewLoggingConfiguration()
	c.Format = logsapi.JSONLogFormat
	if errs := logsapi.Validate(c, nil, nil); len(errs) > 0 {
		t.Errorf("logging format json: %v", errs.ToAggregate())
	}
}

// gauge returns the value of the named gauge's series whose label has the
// given value, from the metrics the scheduler serves.
func gauge(t *testing.T, name, label, value string) (float64, bool) {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}
