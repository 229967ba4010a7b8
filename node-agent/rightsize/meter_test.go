package rightsize

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// meterFixture is a node with containers, their pods and what each uses.
type meterFixture struct {
	now     time.Time
	running []nri.Running
	pods    map[string]*v1.Pod
	uses    map[string]map[string]int64
	failing bool
}

func (f *meterFixture) container(id, pod, rightSize string, cards ...gpuinfo.CardAssignment) {
	uid := types.UID("uid-" + pod)
	f.running = append(f.running, nri.Running{ID: id,
		Owner:    nri.Owner{Namespace: "team-a", Pod: pod, PodUID: uid, Container: "main"},
		Holdings: []enforce.Holding{{Key: id, Cards: cards}}})
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: pod, UID: uid}}
	if rightSize != "" {
		p.Annotations = map[string]string{gpuinfo.RightSizeAnnotation: rightSize}
	}
	f.pods[pod] = p
}

func (f *meterFixture) meter() *Meter {
	return &Meter{
		Running: func() []nri.Running { return f.running },
		Pod: func(_ context.Context, _, name string) (*v1.Pod, error) {
			if p, ok := f.pods[name]; ok {
				return p, nil
			}
			return nil, apierrors.NewNotFound(v1.Resource("pods"), name)
		},
		Uses: func() (map[string]map[string]int64, error) {
			if f.failing {
				return nil, errors.New("the processes on card 1 are unknown")
			}
			return f.uses, nil
		},
		Now: func() time.Time { return f.now },
	}
}

func share(index int, uuid string, mib int64) gpuinfo.CardAssignment {
	return gpuinfo.CardAssignment{Index: index, UUID: uuid, MemoryMiB: mib, Cores: 30}
}

func TestMeter(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	f := &meterFixture{now: start, pods: map[string]*v1.Pod{}}
	f.container("c-nb", "nb", "30m", share(0, "GPU-0", 8192), share(1, "GPU-1", 8192))
	f.container("c-default", "server", "true", share(2, "GPU-2", 4096))
	f.container("c-off", "batch", "", share(0, "GPU-0", 4096))
	f.container("c-bad", "typo", "yes", share(0, "GPU-0", 4096))
	f.container("c-whole", "train", "true", gpuinfo.CardAssignment{Index: 3, UUID: "GPU-3", MemoryMiB: 81920, Cores: 100})
	m := f.meter()
	var invalid []string
	m.Invalid = func(pod *v1.Pod, err error) { invalid = append(invalid, err.Error()) }
	read := func(after time.Duration, uses map[string]map[string]int64) {
		t.Helper()
		f.now, f.uses = start.Add(after), uses
		m.Read(ctx)
	}
	report := func() []gpuinfo.ContainerUse {
		t.Helper()
		raw, err := m.Report()
		if err != nil {
			t.Fatal(err)
		}
		if raw == "" {
			return nil
		}
		r, err := gpuinfo.DecodeUseReport(raw)
		if err != nil {
			t.Fatal(err)
		}
		return r.Containers
	}
	use := func(pod string, now, peak int64, window time.Duration) gpuinfo.ContainerUse {
		return gpuinfo.ContainerUse{Namespace: "team-a", Pod: pod, UID: types.UID("uid-" + pod), Container: "main",
			UseMiB: now, PeakMiB: peak, WindowSeconds: int64(window / time.Second)}
	}
	if got := report(); got != nil {
		t.Fatalf("report before any reading: %v", got)
	}
	// The busiest card counts; other containers' use and cards do not.
	read(0, map[string]map[string]int64{"c-nb": {"GPU-0": 1000, "GPU-1": 1200}, "c-default": {"GPU-2": 100}, "c-off": {"GPU-0": 4000}})
	read(5*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-0": 3000, "GPU-1": 200}, "c-whole": {"GPU-3": 9000}})
	read(10*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-0": 700}, "c-default": {"GPU-2": 300}})
	want := []gpuinfo.ContainerUse{use("nb", 700, 3000, 10*time.Minute), use("server", 300, 300, 10*time.Minute)}
	if diff := cmp.Diff(want, report()); diff != "" {
		t.Errorf("after 10 minutes (-want,+got):\n%s", diff)
	}
	// Past the quiet period the peak covers it alone: 3000 MiB at minute 5
	// is older than 30 minutes at minute 40 (the default's is 30 minutes
	// too).
	read(40*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-1": 500}, "c-default": {"GPU-2": 250}})
	want = []gpuinfo.ContainerUse{use("nb", 500, 700, 30*time.Minute), use("server", 250, 300, 30*time.Minute)}
	if diff := cmp.Diff(want, report()); diff != "" {
		t.Errorf("after 40 minutes (-want,+got):\n%s", diff)
	}
	read(41*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-1": 400}, "c-default": {"GPU-2": 200}})
	want = []gpuinfo.ContainerUse{use("nb", 400, 500, 30*time.Minute), use("server", 200, 250, 30*time.Minute)}
	if diff := cmp.Diff(want, report()); diff != "" {
		t.Errorf("after 41 minutes (-want,+got):\n%s", diff)
	}
	// The pod with an invalid annotation is told once, not at every reading.
	if want := []string{`pod team-a/typo: annotation tessera.io/right-size="yes": want "true", "false" or a quiet period from 1m0s to 24h0m0s (e.g. "2h")`}; !cmp.Equal(want, invalid) {
		t.Errorf("told of invalid annotations %q, want %q", invalid, want)
	}
	// A reading that fails restarts the windows: no quiet period counts
	// time the use was not read.
	f.failing = true
	read(42*time.Minute, nil)
	f.failing = false
	read(44*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-0": 100}, "c-default": {"GPU-2": 50}})
	want = []gpuinfo.ContainerUse{use("nb", 100, 100, 2*time.Minute), use("server", 50, 50, 2*time.Minute)}
	if diff := cmp.Diff(want, report()); diff != "" {
		t.Errorf("after a failed reading (-want,+got):\n%s", diff)
	}
	// A container gone, a pod that opted out and a pod replaced under the
	// same name are dropped.
	f.running = f.running[:1]
	f.pods["nb"].Annotations[gpuinfo.RightSizeAnnotation] = "false"
	read(45*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-0": 100}})
	if got := report(); got != nil {
		t.Errorf("after the containers left or opted out: %v", got)
	}
	f.pods["nb"] = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "nb", UID: "another",
		Annotations: map[string]string{gpuinfo.RightSizeAnnotation: "true"}}}
	read(46*time.Minute, map[string]map[string]int64{"c-nb": {"GPU-0": 100}})
	if got := report(); got != nil {
		t.Errorf("for a pod replaced: %v", got)
	}
}

// TestMeterReportBounded: a node with more opted-in containers than a
// report holds reports the first MaxReported, within the annotation's size.
func TestMeterReportBounded(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := &meterFixture{now: time.Now(), pods: map[string]*v1.Pod{}, uses: map[string]map[string]int64{}}
	for i := range MaxReported + 10 {
		id := "c" + string(rune('a'+i%26)) + time.Duration(i).String()
		f.container(id, "pod-with-a-long-name-of-sixty-characters-or-so-"+id, "true", share(0, "GPU-0", 1024))
		f.uses[id] = map[string]int64{"GPU-0": int64(i)}
	}
	m := f.meter()
	m.Read(ctx)
	raw, err := m.Report()
	if err != nil {
		t.Fatal(err)
	}
	r, err := gpuinfo.DecodeUseReport(raw)
	if err != nil {
		t.Fatalf("%d bytes: %v", len(raw), err)
	}
	if len(r.Containers) != MaxReported {
		t.Errorf("report of %d containers, want %d", len(r.Containers), MaxReported)
	}
}
