package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/manifests"
)

// burstSizes is the mix of a burst: fractional, whole and multi-card pods.
// 100 of each of 5 sizes; over 400 A100s they need about 260 cards.
var burstSizes = []map[string]int64{
	{"tessera.io/gpu-memory": 8192, "tessera.io/gpu-cores": 10},
	{"tessera.io/gpu-memory": 20480, "tessera.io/gpu-cores": 25},
	{"tessera.io/gpu-memory-percent": 50, "tessera.io/gpu-cores": 50},
	{"tessera.io/gpu": 1},
	{"tessera.io/gpu": 2},
}

// createBurst creates pods first to first+n-1 of mixed sizes and returns
// their names.
func (e *env) createBurst(first, n int, scheduler string) []string {
	var names []string
	for i := first; i < first+n; i++ {
		name := fmt.Sprintf("burst-%03d", i)
		names = append(names, name)
		e.create(e.podSpec(name, scheduler, burstSizes[i%len(burstSizes)]))
	}
	return names
}

// countBound returns how many of the namespace's pods are bound.
func (e *env) countBound() (int, error) {
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	bound := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			bound++
		}
	}
	return bound, nil
}

func TestBurst(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 50; i++ {
		e.node(fmt.Sprint("n", i), cluster.A100, 8, nil)
	}
	e.startScheduler()
	start := time.Now()
	names := e.createBurst(0, 500, "tessera-binpack")
	e.waitBound(120*time.Second, names...)
	elapsed := time.Since(start)
	t.Logf("500 pods bound in %v: %.0f pods/s (creation included)", elapsed.Round(time.Millisecond), 500/elapsed.Seconds())
	if got := e.checkNoOvercommit(t); got != 500 {
		t.Errorf("%d GPU pods bound, want 500", got)
	}
}

// replica is a scheduler replica running as its own process (the test
// binary re-executed as the scheduler command), since kube-scheduler exits
// its process when it stops leading.
type replica struct {
	cmd *exec.Cmd
}

// testContext is what startReplica needs of a test or benchmark context.
type testContext interface {
	Helper()
	Fatal(args ...any)
	Logf(format string, args ...any)
	TempDir() string
	Cleanup(func())
	Failed() bool
}

func startReplica(t testContext, name string, args ...string) *replica {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), replicaArgsEnv+"="+strings.Join(args, "\n"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{cmd: cmd}
	t.Cleanup(func() {
		r.kill()
		log.Close()
		if t.Failed() {
			if out, err := os.ReadFile(log.Name()); err == nil {
				t.Logf("%s log tail:\n%s", name, tail(string(out), 4000))
			}
		}
	})
	return r
}

// peakRSS is the replica's peak resident set size in bytes (VmHWM).
func (r *replica) peakRSS() (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err != nil {
				return 0, fmt.Errorf("VmHWM %q: %w", v, err)
			}
			return kib << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", r.cmd.Process.Pid)
}

func (r *replica) kill() {
	if r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestLeaderFailoverMidBurst(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 20; i++ {
		e.node(fmt.Sprint("n", i), cluster.A100, 8, nil)
	}
	// The shipped Lease, which only the scheduler's ServiceAccount may renew.
	lease := "tessera-scheduler"
	t.Cleanup(func() {
		_ = e.client.CoordinationV1().Leases(manifests.Namespace).Delete(context.Background(), lease, metav1.DeleteOptions{})
	})
	args := []string{
		"--config=" + e.config, "--secure-port=0", "--leader-elect=true",
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
	}
	leader := startReplica(t, "replica-a", args...)
	var holder string
	e.waitFor(60*time.Second, "the first replica to lead", func() (bool, error) {
		l, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		holder = *l.Spec.HolderIdentity
		return holder != "", nil
	})
	startReplica(t, "replica-b", args...)
	// The burst's first half goes to the leader, which is killed while
	// binding it; the second half arrives when only the standby is left.
	names := e.createBurst(0, 100, "tessera-binpack")
	e.waitFor(60*time.Second, "the leader to bind part of the burst", func() (bool, error) {
		n, err := e.countBound()
		return n >= 20, err
	})
	leader.kill()
	killedAt := time.Now()
	names = append(names, e.createBurst(100, 100, "tessera-binpack")...)
	e.waitBound(90*time.Second, names...)
	t.Logf("burst finished %v after the leader was killed", time.Since(killedAt).Round(time.Millisecond))
	l, err := e.client.CoordinationV1().Leases(manifests.Namespace).Get(e.tCtx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity == holder {
		t.Errorf("the killed replica %s still holds the lease", holder)
	}
	if got := e.checkNoOvercommit(t); got != 200 {
		t.Errorf("%d GPU pods bound, want 200", got)
	}
}
