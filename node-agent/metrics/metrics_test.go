package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/internal/version"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

const node = "node-1"

// Container IDs as the runtime reports them, 64 hex digits.
var (
	idTrain = strings.Repeat("a1", 32)
	idInfer = strings.Repeat("b2", 32)
	idSide  = strings.Repeat("c3", 32)
	idGone  = strings.Repeat("d4", 32) // a container of no pod on the node
)

// gpuPod is a pod bound to nodeName with an assignment (raw annotation;
// "" for none) whose containers run under the given IDs (name → ID).
func gpuPod(namespace, name, nodeName, assignment string, ids map[string]string) *v1.Pod {
	b := st.MakePod().Name(name).Namespace(namespace).UID("uid-" + name).Node(nodeName).Container("main")
	if assignment != "" {
		b.Annotation(gpuinfo.AssignmentAnnotation, assignment)
	}
	p := b.Obj()
	p.Status.Phase = v1.PodRunning
	for container, id := range ids {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{Name: container, ContainerID: "containerd://" + id})
	}
	return p
}

// nodePods are the test's pods: two sharing card 0, one also on card 1, and
// pods that must not appear.
func nodePods() []*v1.Pod {
	train := gpuPod("team-a", "train", node,
		`{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-sim-node-1-0","memoryMiB":20480,"cores":50}]}}`,
		map[string]string{"main": idTrain})
	infer := gpuPod("team-b", "infer", node,
		`{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-sim-node-1-0","memoryMiB":10240,"cores":30},{"index":1,"uuid":"GPU-sim-node-1-1","memoryMiB":10240,"cores":30}]}}`,
		map[string]string{"main": idInfer})
	// A sidecar started as a restartable init container, without GPUs.
	infer.Status.InitContainerStatuses = []v1.ContainerStatus{{Name: "proxy", ContainerID: "containerd://" + idSide}}
	done := gpuPod("team-a", "done", node,
		`{"version":1,"containers":{"main":[{"index":1,"uuid":"GPU-sim-node-1-1","memoryMiB":4096,"cores":10}]}}`, nil)
	done.Status.Phase = v1.PodSucceeded
	return []*v1.Pod{
		train, infer, done,
		gpuPod("team-a", "elsewhere", "node-2",
			`{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-sim-node-2-0","memoryMiB":1024,"cores":10}]}}`, nil),
		gpuPod("team-a", "broken", node, `{"version":1,"containers":{}}`, nil),
		gpuPod("team-a", "cpu", node, "", map[string]string{"main": strings.Repeat("e5", 32)}),
	}
}

// statsBackend is a backend whose statistics come from a function.
type statsBackend struct {
	discovery.Backend
	stats func() ([]discovery.CardStats, error)
}

func (b statsBackend) Stats() ([]discovery.CardStats, error) { return b.stats() }

// noStats hides the simulated backend's statistics.
type noStats struct{ discovery.Backend }

// samples are the collector's samples of the named metrics, in the text
// exposition format without its comments.
func samples(t *testing.T, c *Collector, names ...string) []string {
	t.Helper()
	raw, err := promtest.CollectAndFormat(c, expfmt.TypeTextPlain, names...)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	return lines
}

var (
	cardMetrics = []string{
		"tessera_agent_card_info", "tessera_agent_card_memory_total_mib", "tessera_agent_card_memory_used_mib",
		"tessera_agent_card_utilization_ratio", "tessera_agent_card_temperature_celsius", "tessera_agent_card_healthy",
		"tessera_agent_card_xid_errors_total",
	}
	containerMetrics = []string{
		"tessera_agent_container_memory_assigned_mib", "tessera_agent_container_cores_assigned_percent",
		"tessera_agent_container_memory_used_mib",
	}
)

func TestCollector(t *testing.T) {
	sim, err := discovery.NewSimulated(node, "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	// Card 0: the training container uses more than it was assigned, and a
	// process outside any known container (a gone container's) uses some.
	sim.SetUsage(0, discovery.SimulatedUsage{Utilization: 0.87, TemperatureC: 64,
		Containers: map[string]int64{idTrain: 24576, idInfer: 8000, idGone: 300}, OtherMiB: 200})
	sim.SetUsage(1, discovery.SimulatedUsage{Utilization: 0.05, TemperatureC: 41, Containers: map[string]int64{idInfer: 1500}})
	cards, _ := sim.Cards()
	cards[1].Healthy = false // the agent's verdict, e.g. after an XID
	pods := func() ([]*v1.Pod, error) { return nodePods(), nil }
	hang := make(chan struct{})
	defer close(hang)

	cardsWant := []string{
		`tessera_agent_card_healthy{card="0",node="node-1"} 1`,
		`tessera_agent_card_healthy{card="1",node="node-1"} 0`,
		`tessera_agent_card_info{card="0",model="NVIDIA A100-SXM4-80GB",node="node-1",uuid="GPU-sim-node-1-0"} 1`,
		`tessera_agent_card_info{card="1",model="NVIDIA A100-SXM4-80GB",node="node-1",uuid="GPU-sim-node-1-1"} 1`,
		`tessera_agent_card_memory_total_mib{card="0",node="node-1"} 81920`,
		`tessera_agent_card_memory_total_mib{card="1",node="node-1"} 81920`,
	}
	liveWant := []string{
		`tessera_agent_card_memory_used_mib{card="0",node="node-1"} 33076`,
		`tessera_agent_card_memory_used_mib{card="1",node="node-1"} 1500`,
		`tessera_agent_card_temperature_celsius{card="0",node="node-1"} 64`,
		`tessera_agent_card_temperature_celsius{card="1",node="node-1"} 41`,
		`tessera_agent_card_utilization_ratio{card="0",node="node-1"} 0.87`,
		`tessera_agent_card_utilization_ratio{card="1",node="node-1"} 0.05`,
	}
	xidsWant := []string{
		`tessera_agent_card_xid_errors_total{card="0",node="node-1",xid="13"} 1`,
		`tessera_agent_card_xid_errors_total{card="0",node="node-1",xid="79"} 2`,
	}
	// In the exposition's order: by name, then labels.
	allCards := append(append(append([]string{}, cardsWant...), liveWant...), xidsWant...)
	assignedWant := []string{
		`tessera_agent_container_cores_assigned_percent{card="0",container="main",namespace="team-a",node="node-1",pod="train"} 50`,
		`tessera_agent_container_cores_assigned_percent{card="0",container="main",namespace="team-b",node="node-1",pod="infer"} 30`,
		`tessera_agent_container_cores_assigned_percent{card="1",container="main",namespace="team-b",node="node-1",pod="infer"} 30`,
		`tessera_agent_container_memory_assigned_mib{card="0",container="main",namespace="team-a",node="node-1",pod="train"} 20480`,
		`tessera_agent_container_memory_assigned_mib{card="0",container="main",namespace="team-b",node="node-1",pod="infer"} 10240`,
		`tessera_agent_container_memory_assigned_mib{card="1",container="main",namespace="team-b",node="node-1",pod="infer"} 10240`,
	}
	usedWant := []string{
		`tessera_agent_container_memory_used_mib{card="0",container="",namespace="",node="node-1",pod=""} 500`,
		`tessera_agent_container_memory_used_mib{card="0",container="main",namespace="team-a",node="node-1",pod="train"} 24576`,
		`tessera_agent_container_memory_used_mib{card="0",container="main",namespace="team-b",node="node-1",pod="infer"} 8000`,
		`tessera_agent_container_memory_used_mib{card="1",container="",namespace="",node="node-1",pod=""} 0`,
		`tessera_agent_container_memory_used_mib{card="1",container="main",namespace="team-b",node="node-1",pod="infer"} 1500`,
	}

	for _, tc := range []struct {
		name    string
		backend discovery.Backend
		pods    PodLister // nil: the pod cache has not synced
		names   []string
		want    []string
	}{
		{name: "cards", backend: sim, names: cardMetrics, want: allCards},
		{name: "containers", backend: sim, pods: pods, names: containerMetrics, want: append(assignedWant, usedWant...)},
		{name: "pod cache not synced: every process unattributed", backend: sim, names: containerMetrics, want: []string{
			`tessera_agent_container_memory_used_mib{card="0",container="",namespace="",node="node-1",pod=""} 33076`,
			`tessera_agent_container_memory_used_mib{card="1",container="",namespace="",node="node-1",pod=""} 1500`,
		}},
		{name: "pods failing to list", backend: sim, pods: func() ([]*v1.Pod, error) { return nil, errors.New("boom") },
			names: []string{"tessera_agent_container_memory_assigned_mib"}},
		{name: "a backend without statistics", backend: noStats{sim}, pods: pods,
			names: append(cardMetrics, containerMetrics...), want: append(append(append([]string{}, cardsWant...), xidsWant...), assignedWant...)},
		{name: "a backend reading part of the statistics", backend: statsBackend{sim, func() ([]discovery.CardStats, error) {
			return []discovery.CardStats{
				{Index: 0, UUID: "GPU-sim-node-1-0", MemoryUsedMiB: 100, Utilization: -1, TemperatureC: 50},
				{Index: 1, UUID: "GPU-sim-node-1-1", MemoryUsedMiB: -1, Utilization: 0.5, TemperatureC: -1,
					ProcessesKnown: true, Processes: []discovery.Process{{ContainerID: idTrain, MemoryUsedMiB: 7}}},
			}, errors.New("GPU 0: reading utilization: Unknown Error")
		}}, pods: pods, names: []string{
			"tessera_agent_card_memory_used_mib", "tessera_agent_card_utilization_ratio", "tessera_agent_card_temperature_celsius",
			"tessera_agent_container_memory_used_mib",
		}, want: []string{
			`tessera_agent_card_memory_used_mib{card="0",node="node-1"} 100`,
			`tessera_agent_card_temperature_celsius{card="0",node="node-1"} 50`,
			`tessera_agent_card_utilization_ratio{card="1",node="node-1"} 0.5`,
			`tessera_agent_container_memory_used_mib{card="1",container="",namespace="",node="node-1",pod=""} 0`,
			`tessera_agent_container_memory_used_mib{card="1",container="main",namespace="team-a",node="node-1",pod="train"} 7`,
		}},
		{name: "a backend failing", backend: statsBackend{sim, func() ([]discovery.CardStats, error) {
			return nil, errors.New("counting GPUs: GPU is lost")
		}}, pods: pods, names: append(cardMetrics, containerMetrics...), want: append(append(append([]string{}, cardsWant...), xidsWant...), assignedWant...)},
		{name: "a backend panicking", backend: statsBackend{sim, func() ([]discovery.CardStats, error) {
			panic("nil device")
		}}, names: cardMetrics, want: append(append([]string{}, cardsWant...), xidsWant...)},
		{name: "a backend hanging", backend: statsBackend{sim, func() ([]discovery.CardStats, error) {
			<-hang
			return nil, nil
		}}, pods: pods, names: append(cardMetrics, containerMetrics...), want: append(append(append([]string{}, cardsWant...), xidsWant...), assignedWant...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(node, tc.backend)
			c.Stats = discovery.NewBoundedStats(tc.backend, 100*time.Millisecond)
			c.Update(cards)
			c.ObserveXID("GPU-sim-node-1-0", 79)
			c.ObserveXID("GPU-sim-node-1-0", 13)
			c.ObserveXID("GPU-sim-node-1-0", 79)
			c.ObserveXID("GPU-gone", 48) // a card no longer on the node
			if tc.pods != nil {
				c.SetPods(tc.pods)
			}
			if diff := cmp.Diff(tc.want, samples(t, c, tc.names...)); diff != "" {
				t.Errorf("samples (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestCollectorHangingBackend checks that a backend reading that outlives
// its scrape is not joined by another, and that scrapes read it again once
// it has returned.
func TestCollectorHangingBackend(t *testing.T) {
	sim, err := discovery.NewSimulated(node, "1xT4-16GB")
	if err != nil {
		t.Fatal(err)
	}
	release, calls := make(chan struct{}), 0
	hanging := statsBackend{sim, func() ([]discovery.CardStats, error) {
		calls++
		<-release
		return sim.Stats()
	}}
	c := New(node, hanging)
	c.Stats = discovery.NewBoundedStats(hanging, 50*time.Millisecond)
	temperature := []string{"tessera_agent_card_temperature_celsius"}
	for i := 0; i < 2; i++ {
		if got := samples(t, c, temperature...); got != nil {
			t.Fatalf("scrape %d while the backend hangs: %v", i, got)
		}
	}
	close(release)
	want := []string{`tessera_agent_card_temperature_celsius{card="0",node="node-1"} 30`}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := samples(t, c, temperature...)
		if cmp.Equal(want, got) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("samples after the backend answered again (-want,+got):\n%s", cmp.Diff(want, got))
		}
	}
	if calls != 2 {
		t.Errorf("the backend was read %d times, want 2 (none while the first reading hung)", calls)
	}
}

func TestLint(t *testing.T) {
	sim, _ := discovery.NewSimulated(node, "1xT4-16GB")
	c := New(node, sim)
	cards, _ := sim.Cards()
	c.Update(cards)
	c.ObserveXID(cards[0].UUID, 79)
	c.SetPods(func() ([]*v1.Pod, error) { return nodePods(), nil })
	problems, err := promtest.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestContainerOf(t *testing.T) {
	procRoot := t.TempDir()
	for pid, cgroup := range map[string]string{
		// cgroup v2, systemd driver (containerd), as read from the agent's
		// own cgroup namespace.
		"100": "0::/../../kubepods-burstable-poda1b2c3d4_0000_1111_2222_333344445555.slice/cri-containerd-" + idTrain + ".scope\n",
		// cgroup v1, cgroupfs driver: one line per hierarchy.
		"200": "12:memory:/kubepods/besteffort/pod0a1b2c3d-0000-1111-2222-333344445555/" + idInfer + "\n" +
			"11:cpu,cpuacct:/kubepods/besteffort/pod0a1b2c3d-0000-1111-2222-333344445555/" + idInfer + "\n",
		// CRI-O.
		"300": "0::/kubepods.slice/kubepods-pod1.slice/crio-" + idSide + ".scope\n",
		// A container of no known pod, and a process outside Kubernetes.
		"400": "0::/kubepods.slice/cri-containerd-" + idGone + ".scope\n",
		"500": "0::/system.slice/nvidia-persistenced.service\n",
	} {
		if err := os.MkdirAll(filepath.Join(procRoot, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(procRoot, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	known := containerIDs(nodePods())
	for _, tc := range []struct {
		pid  uint32
		want string
	}{
		{100, idTrain}, {200, idInfer}, {300, idSide}, {400, ""}, {500, ""},
		{600, ""}, // exited since NVML listed it
	} {
		if got := discovery.ContainerOfProcess(procRoot, tc.pid, func(id string) bool { _, ok := known[id]; return ok }); got != tc.want {
			t.Errorf("ContainerOfProcess(%d) = %q, want %q", tc.pid, got, tc.want)
		}
	}
	if diff := cmp.Diff(containerRef{"team-b", "infer", "proxy"}, known[idSide], cmp.AllowUnexported(containerRef{})); diff != "" {
		t.Errorf("sidecar (-want,+got):\n%s", diff)
	}
}

// TestHandler scrapes the endpoint over HTTP, as Prometheus does.
func TestHandler(t *testing.T) {
	sim, _ := discovery.NewSimulated(node, "1xL4-24GB")
	c := New(node, sim)
	cards, _ := sim.Cards()
	c.Update(cards)
	c.SetPods(func() ([]*v1.Pod, error) {
		return []*v1.Pod{gpuPod("ns", "p", node, `{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-sim-node-1-0","memoryMiB":2048,"cores":20}]}}`, nil)}, nil
	})
	server := httptest.NewServer(Handler(klog.Background(), NewRegistry(c)))
	defer server.Close()
	url := server.URL + "/metrics"
	if err := promtest.ScrapeAndCompare(url, strings.NewReader(`
# HELP tessera_agent_card_info A card of the node (always 1), with its UUID and model.
# TYPE tessera_agent_card_info gauge
tessera_agent_card_info{card="0",model="NVIDIA L4",node="node-1",uuid="GPU-sim-node-1-0"} 1
# HELP tessera_agent_container_memory_assigned_mib GPU memory the container was assigned on the card, MiB (its pod's tessera.io/gpu-assignment).
# TYPE tessera_agent_container_memory_assigned_mib gauge
tessera_agent_container_memory_assigned_mib{card="0",container="main",namespace="ns",node="node-1",pod="p"} 2048
`), "tessera_agent_card_info", "tessera_agent_container_memory_assigned_mib"); err != nil {
		t.Error(err)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"go_goroutines ", "process_resident_memory_bytes ", "tessera_agent_card_temperature_celsius{", `tessera_build_info{go_version="` + runtime.Version() + `",revision="` + version.Revision() + `",version="` + version.Version + `"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
}

// TestCollectorFindsContainersByPID: a backend naming processes by host PID
// (NVML) has them attributed through their cgroups under ProcRoot.
func TestCollectorFindsContainersByPID(t *testing.T) {
	procRoot := t.TempDir()
	for pid, cgroup := range map[string]string{
		"100": "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-" + idTrain + ".scope\n",
		"101": "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-" + idTrain + ".scope\n",
		"200": "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-" + idInfer + ".scope\n",
		"300": "0::/system.slice/xorg.service\n",
	} {
		if err := os.MkdirAll(filepath.Join(procRoot, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(procRoot, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sim, _ := discovery.NewSimulated(node, "1xA100-80GB")
	c := New(node, statsBackend{sim, func() ([]discovery.CardStats, error) {
		return []discovery.CardStats{{Index: 0, UUID: "GPU-sim-node-1-0", MemoryUsedMiB: 40000, ProcessesKnown: true, Processes: []discovery.Process{
			{PID: 100, MemoryUsedMiB: 20000}, {PID: 101, MemoryUsedMiB: 2000}, // two processes of one container
			{PID: 200, MemoryUsedMiB: 9000},
			{PID: 300, MemoryUsedMiB: 100}, // outside Kubernetes
			{PID: 400, MemoryUsedMiB: 50},  // exited since
		}}}, nil
	}})
	c.ProcRoot = procRoot
	c.SetPods(func() ([]*v1.Pod, error) { return nodePods(), nil })
	want := []string{
		`tessera_agent_container_memory_used_mib{card="0",container="",namespace="",node="node-1",pod=""} 150`,
		`tessera_agent_container_memory_used_mib{card="0",container="main",namespace="team-a",node="node-1",pod="train"} 22000`,
		`tessera_agent_container_memory_used_mib{card="0",container="main",namespace="team-b",node="node-1",pod="infer"} 9000`,
	}
	if diff := cmp.Diff(want, samples(t, c, "tessera_agent_container_memory_used_mib")); diff != "" {
		t.Errorf("samples (-want,+got):\n%s", diff)
	}
}

// TestMetricsDocumented: the agent exports exactly the tessera_ metrics
// docs/observability.md lists (the alert rules are checked against that
// list).
func TestMetricsDocumented(t *testing.T) {
	ch := make(chan *prometheus.Desc, 32)
	New("n", nil).Describe(ch)
	close(ch)
	var got []string
	for d := range ch {
		if name := testutil.DescName(d.String()); strings.HasPrefix(name, "tessera_") {
			got = append(got, name)
		}
	}
	sort.Strings(got)
	if diff := cmp.Diff(testutil.DocumentedMetrics(t, "Agent metrics"), got); diff != "" {
		t.Errorf("exported metrics (-documented,+exported):\n%s", diff)
	}
}
