package overuse

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/google/go-cmp/cmp"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/discovery/nvidia"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// fixture is a node read through go-nvml's mock DGX A100 (40 GiB cards),
// whose processes the test sets, with a stand-in /proc naming each
// process's container.
type fixture struct {
	server   *dgxa100.Server
	procRoot string
	mu       sync.Mutex
	procs    map[int][]nvml.ProcessInfo // by card
}

func newFixture(t *testing.T, cgroups map[uint32]string) *fixture {
	f := &fixture{server: dgxa100.New(), procRoot: t.TempDir(), procs: map[int][]nvml.ProcessInfo{}}
	f.server.ErrorStringFunc = func(r nvml.Return) string { return fmt.Sprint("NVML error ", int32(r)) }
	for i, d := range f.server.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.procs[i], nvml.SUCCESS
		}
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	for pid, container := range cgroups {
		dir := filepath.Join(f.procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/kubepods.slice/cri-containerd-"+container+".scope\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// use makes NVML report that pid uses mib on card i (replacing what it
// reported there).
func (f *fixture) use(card int, usage map[uint32]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var procs []nvml.ProcessInfo
	for pid, mib := range usage {
		procs = append(procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: uint64(mib) << 20})
	}
	sort.Slice(procs, func(a, b int) bool { return procs[a].Pid < procs[b].Pid })
	f.procs[card] = procs
}

func (f *fixture) uuid(i int) string {
	u, _ := f.server.Devices[i].GetUUID()
	return u
}

// share is a holding of mib on card i.
func (f *fixture) share(key string, i int, mib int64) enforce.Holding {
	return enforce.Holding{Key: key, Cards: []gpuinfo.CardAssignment{{Index: i, UUID: f.uuid(i), MemoryMiB: mib, Cores: 30}}}
}

// TestDetector: NVML's readings of each container's processes, against the
// shares the runtime's containers hold: a holder over its share on two
// readings in a row is reported once per episode (and stopped when told
// to), a claim's containers are summed, a container using a card it holds
// nothing of is over, and an unrestricted container or an unknown process
// is not judged.
func TestDetector(t *testing.T) {
	f := newFixture(t, map[uint32]string{101: "ctra", 102: "ctra", 201: "ctrb", 301: "ctrc1", 302: "ctrc2", 401: "ctrplain", 501: "ctrexporter"})
	backend, err := nvidia.New(f.server)
	if err != nil {
		t.Fatal(err)
	}
	running := []nri.Running{
		{ID: "ctra", Owner: nri.Owner{Namespace: "team-a", Pod: "a", Container: "main"}, Holdings: []enforce.Holding{f.share("container/ctra", 0, 8192)}},
		{ID: "ctrb", Owner: nri.Owner{Namespace: "team-b", Pod: "b", Container: "main"}, Holdings: []enforce.Holding{f.share("container/ctrb", 0, 8192)}},
		{ID: "ctrc1", Owner: nri.Owner{Namespace: "team-c", Pod: "c", Container: "one"}, Holdings: []enforce.Holding{f.share("claim/c", 1, 10240)}},
		{ID: "ctrc2", Owner: nri.Owner{Namespace: "team-c", Pod: "c", Container: "two"}, Holdings: []enforce.Holding{f.share("claim/c", 1, 10240)}},
		{ID: "ctrplain", Owner: nri.Owner{Namespace: "team-d", Pod: "d", Container: "main"}},
		{ID: "ctrexporter", Owner: nri.Owner{Namespace: "mon", Pod: "e", Container: "main", Unrestricted: true}},
	}
	var reports []string
	killed := map[uint32]bool{}
	d := &Detector{
		Stats: discovery.NewBoundedStats(backend, time.Second), Running: func() []nri.Running { return running }, ProcRoot: f.procRoot,
		Report: func(e Exceeded) {
			var names []string
			for _, c := range e.Containers {
				names = append(names, c.Pod+"/"+c.Container)
			}
			slices.Sort(names)
			reports = append(reports, fmt.Sprintf("%s card %d: %d of %d MiB, pids %v, stopped %t", strings.Join(names, ","), e.Card, e.UsedMiB, e.HeldMiB, e.PIDs, e.Stopped))
		},
		kill: func(procRoot string, pid uint32, container string) error {
			if procRoot != f.procRoot {
				return fmt.Errorf("wrong proc root %s", procRoot)
			}
			killed[pid] = true
			return nil
		},
	}
	tCtx := ktesting.Init(t)
	check := func(want ...string) {
		t.Helper()
		reports = nil
		d.Check(tCtx)
		if diff := cmp.Diff(want, reports); diff != "" {
			t.Errorf("reports (-want,+got):\n%s", diff)
		}
	}
	// a within its 8 GiB over two processes, b over it; each claim
	// container within 10 GiB, not together; plain uses a card it holds
	// none of; the exporter and an unknown process use what they like.
	f.use(0, map[uint32]int64{101: 4096, 102: 4096, 201: 9000, 501: 30000, 999: 20000})
	f.use(1, map[uint32]int64{301: 6000, 302: 6000})
	f.use(2, map[uint32]int64{401: 300})
	check() // one reading is not enough
	check(
		"b/main card 0: 9000 of 8192 MiB, pids [201], stopped false",
		"c/one,c/two card 1: 12000 of 10240 MiB, pids [301 302], stopped false",
		"d/main card 2: 300 of 0 MiB, pids [401], stopped false",
	)
	check() // told once per episode
	f.use(0, map[uint32]int64{101: 4096, 102: 4096, 201: 8000})
	check() // b back within its share: the episode ends
	f.use(0, map[uint32]int64{101: 4096, 102: 5000, 201: 9000})
	check()
	d.Stop = true
	check(
		"a/main card 0: 9096 of 8192 MiB, pids [101 102], stopped true",
		"b/main card 0: 9000 of 8192 MiB, pids [201], stopped true",
		"c/one,c/two card 1: 12000 of 10240 MiB, pids [301 302], stopped true",
		"d/main card 2: 300 of 0 MiB, pids [401], stopped true",
	)
	if want := map[uint32]bool{101: true, 102: true, 201: true, 301: true, 302: true, 401: true}; !cmp.Equal(want, killed) {
		t.Errorf("killed %v, want %v (never the exporter's or an unknown process)", killed, want)
	}
	// A container's use per card (a resize's check): its own processes'
	// alone, not another container's or an unknown process's.
	f.use(3, map[uint32]int64{102: 500, 999: 7000})
	use, err := d.Use("ctra")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{f.uuid(0): 9096, f.uuid(3): 500}, use); diff != "" {
		t.Errorf("Use (-want,+got):\n%s", diff)
	}
	// Every container's at once (right-sizing's readings): the same figures,
	// and nothing for the unknown process.
	uses, err := d.Uses()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(use, uses["ctra"]); diff != "" {
		t.Errorf("Uses()[ctra] (-Use,+Uses):\n%s", diff)
	}
	if _, ok := uses[""]; ok {
		t.Errorf("Uses counts processes of no container: %v", uses)
	}
}

// TestKillChecksTheContainer: a process is killed only while its cgroup is
// the container's (a PID NVML listed may have been reused since).
func TestKillChecksTheContainer(t *testing.T) {
	f := newFixture(t, map[uint32]string{4242: "ctrother"})
	if err := discovery.KillContainerProcess(f.procRoot, 4242, "ctra"); err == nil || !strings.Contains(err.Error(), "no longer container ctra's") {
		t.Errorf("killing another container's process: %v", err)
	}
	if err := discovery.KillContainerProcess(f.procRoot, 4343, "ctra"); err == nil || !strings.Contains(err.Error(), "reading process 4343") {
		t.Errorf("killing a process gone: %v", err)
	}
}
