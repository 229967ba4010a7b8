//go:build e2enode

// Package e2enode runs the node agent against a real container runtime:
// containerd and runc (built from their Go modules by `make e2e-node`) with
// NRI, pods scheduled by Tessera's scheduler on an in-process control plane,
// and the CRI driven as kubelet drives it. What runs is read from the runtime's
// OCI spec and the container process's /proc entries.
package e2enode

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// binEnv names the directory `make e2e-node` builds into: containerd,
// containerd-shim-runc-v2, ctr, runc, node-agent and e2e-image.tar.
const binEnv = "TESSERA_E2E_BIN"

// node is the GPU node the tests run containers on; cards is how many
// simulated A100s its agent reports.
const (
	node  = "e2e-node"
	cards = 4
)

// suite is what TestMain starts, once for all tests.
var suite struct {
	dir, bin, runc string
	cp             *cluster.ControlPlane
	runtime        *containerd
	agent          *agentProcess
}

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-node:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("must run as root: runc creates namespaces, cgroups and device nodes")
	}
	suite.bin = os.Getenv(binEnv)
	if suite.bin == "" {
		return 0, fmt.Errorf("%s is not set; run `make e2e-node`, which builds containerd and the test image", binEnv)
	}
	var err error
	suite.runc = filepath.Join(suite.bin, "runc")
	if _, err := os.Stat(suite.runc); err != nil {
		return 0, fmt.Errorf("runc (make e2e-node builds it): %w", err)
	}
	if suite.dir, err = os.MkdirTemp("", "tessera-e2e-"); err != nil {
		return 0, err
	}
	code := 1
	defer func() {
		if code == 0 {
			_ = os.RemoveAll(suite.dir)
		} else {
			fmt.Printf("the logs of containerd, the agent and the control plane are kept in %s\n", suite.dir)
		}
	}()
	if err := cluster.LogToFile(filepath.Join(suite.dir, "control-plane.log")); err != nil {
		return 0, err
	}
	ctx := context.Background()
	start := time.Now()
	if suite.runtime, err = startContainerd(ctx, suite.bin, filepath.Join(suite.dir, "containerd"), suite.runc, map[string]string{"nvidia.yaml": cdiSpec(cards), "nic.yaml": foreignSpec}); err != nil {
		return 0, err
	}
	defer suite.runtime.stop()
	out, _ := exec.Command(suite.runc, "--version").Output()
	fmt.Printf("runtime: %s, runc %s\n", suite.runtime.Version, strings.Fields(string(out) + " ? ?")[2])

	if suite.cp, err = cluster.Start(func(format string, args ...any) { klog.V(2).Infof(format, args...) }); err != nil {
		return 0, err
	}
	defer suite.cp.Stop()
	gpuNode := cluster.NewNode(node, nil)
	cluster.AdvertiseGPUs(gpuNode, cards)
	if _, err := suite.cp.Client.CoreV1().Nodes().Create(ctx, gpuNode, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	other, err := suite.cp.AddSimulatedNode(ctx, otherNode, cluster.A100, 1, nil)
	if err != nil {
		return 0, err
	}
	agents, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	go other.Run(agents)

	sched, err := startScheduler(ctx, suite.cp, suite.dir)
	if err != nil {
		return 0, err
	}
	defer sched.Stop()
	if suite.agent, err = startAgent(ctx); err != nil {
		return 0, err
	}
	defer func() { suite.agent.stop() }()
	fmt.Printf("containerd, control plane, scheduler and agent ready in %v\n", time.Since(start).Round(time.Millisecond))
	code = m.Run()
	return code, nil
}

// agentMetricsAddress is where the agent serves its metrics in the test.
const agentMetricsAddress = "127.0.0.1:19402"

// otherNode is a second GPU node, whose pods must not start on node.
const otherNode = "e2e-other"

// startScheduler runs the installed scheduler configuration as the
// scheduler's ServiceAccount, in this process.
func startScheduler(ctx context.Context, cp *cluster.ControlPlane, dir string) (*cluster.Scheduler, error) {
	kubeconfig := filepath.Join(dir, "scheduler-kubeconfig")
	config := filepath.Join(dir, "scheduler-config.yaml")
	if err := cp.WriteSchedulerKubeconfig(kubeconfig); err != nil {
		return nil, err
	}
	if err := cluster.WriteSchedulerConfig(cp.SchedulerConfig, kubeconfig, config); err != nil {
		return nil, err
	}
	return cluster.StartScheduler(ctx, config)
}

// cdiSpec is the node's CDI spec, as `nvidia-ctk cdi generate` names cards
// by default (nvidia.com/gpu=<index>, and nvidia.com/gpu=all): each card's
// device node is /dev/nvidia<index>, character 195:<index> as NVIDIA's
// driver numbers it (runc creates the node in the container; with no
// driver behind it, opening it fails), and every card brings /dev/nvidiactl.
func cdiSpec(cards int) string {
	var b strings.Builder
	b.WriteString("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  deviceNodes:\n  - {path: /dev/nvidiactl, type: c, major: 195, minor: 255}\ndevices:\n")
	var all strings.Builder
	for i := 0; i < cards; i++ {
		node := fmt.Sprintf("    - {path: /dev/nvidia%d, type: c, major: 195, minor: %d}\n", i, i)
		fmt.Fprintf(&b, "- name: \"%d\"\n  containerEdits:\n    deviceNodes:\n%s", i, node)
		all.WriteString(node)
	}
	// The card in MIG mode's slices, as the NVIDIA toolkit names them
	// ("CARD:MIG INDEX"): the card's node and the slice's two capability
	// nodes (migCaps).
	for index, gi := range migInstances {
		fmt.Fprintf(&b, "- name: \"%d:%d\"\n  containerEdits:\n    deviceNodes:\n", migCard, index)
		fmt.Fprintf(&b, "    - {path: /dev/nvidia%d, type: c, major: 195, minor: %d}\n", migCard, migCard)
		for _, c := range []int{capMinor(gi, false), capMinor(gi, true)} {
			fmt.Fprintf(&b, "    - {path: /dev/nvidia-caps/nvidia-cap%d, type: c, major: %d, minor: %d}\n", c, capsMajor, c)
		}
	}
	fmt.Fprintf(&b, "- name: all\n  containerEdits:\n    deviceNodes:\n%s", all.String())
	return b.String()
}

// The card in MIG mode, after the whole cards: an A100 40GB with a 3g.20gb
// slice at slot 0 (MIG device 0, GPU instance 1) and 1g.5gb slices at slots
// 5 and 6 (MIG devices 1 and 2, GPU instances 2 and 3), as the simulated
// backend numbers them.
const (
	migCard    = cards
	migSpec    = "1xA100-40GB:mig=3g.20gb@0+1g.5gb@5+1g.5gb@6"
	capsMajor  = 237
	configCap  = 1
	monitorCap = 2
)

// migInstances are the GPU instances of the card in MIG mode, by MIG device
// index.
var migInstances = []int{1, 2, 3}

// capMinor is the minor number of the capability node of GPU instance gi of
// the card in MIG mode (of its compute instance 0 when ci).
func capMinor(gi int, ci bool) int {
	if ci {
		return 10*gi + 1
	}
	return 10 * gi
}

// migCaps is the driver's list of the node's MIG capabilities
// (/proc/driver/nvidia-caps/mig-minors on a real node).
func migCaps() string {
	var b strings.Builder
	fmt.Fprintf(&b, "config %d\nmonitor %d\n", configCap, monitorCap)
	for _, gi := range migInstances {
		fmt.Fprintf(&b, "gpu%d/gi%d/access %d\ngpu%d/gi%d/ci0/access %d\n", migCard, gi, capMinor(gi, false), migCard, gi, capMinor(gi, true))
	}
	return b.String()
}

// foreignKind is the CDI kind of another driver's devices on the node (a
// NIC's): its device eth1 is /dev/example-nic, /dev/zero's numbers.
const foreignKind = "nic.example.com/nic"

// foreignSpec is the CDI spec of foreignKind.
const foreignSpec = "cdiVersion: 0.6.0\nkind: " + foreignKind + "\ndevices:\n- name: eth1\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/example-nic, type: c, major: 1, minor: 5}\n"

// agentProcess is the node agent binary running for node, with its NRI
// plugin connected to the test's containerd.
type agentProcess struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has exited
	err    error         // its exit status, once exited
}

// vgpuDir holds the host side of the interception library's files.
func vgpuDir() string { return filepath.Join(suite.dir, "vgpu") }

// startAgent starts the node agent and waits until its heartbeat says it
// can enforce (connected to the runtime, pod cache synced).
func startAgent(ctx context.Context) (*agentProcess, error) {
	kubeconfig := filepath.Join(suite.dir, "agent-kubeconfig")
	if err := cluster.WriteKubeconfig(suite.cp.AgentConfig(node), kubeconfig); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(vgpuDir(), "cache"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(suite.dir, "mig-minors"), []byte(migCaps()), 0o644); err != nil {
		return nil, err
	}
	// A stand-in for HAMi-core's library: the agent only mounts it.
	if err := os.WriteFile(filepath.Join(vgpuDir(), "libvgpu.so"), []byte("stand-in"), 0o644); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(suite.dir, "agent.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	a := &agentProcess{exited: make(chan struct{})}
	a.cmd = exec.Command(filepath.Join(suite.bin, "node-agent"),
		"--node-name="+node, "--namespace="+manifests.Namespace, "--kubeconfig="+kubeconfig,
		fmt.Sprintf("--simulated-gpus=%dxA100-80GB,%s", cards, migSpec), "--device-plugin-dir=",
		"--mig-capabilities="+filepath.Join(suite.dir, "mig-minors"),
		"--nri-socket="+filepath.Join(suite.dir, "containerd", "nri.sock"),
		"--vgpu-library="+filepath.Join(vgpuDir(), "libvgpu.so"),
		"--vgpu-preload="+filepath.Join(vgpuDir(), "ld.so.preload"),
		"--vgpu-cache-dir="+filepath.Join(vgpuDir(), "cache"),
		"--heartbeat-interval=1s", "--lease-duration=5s", "--metrics-address="+agentMetricsAddress, "-v=2")
	a.cmd.Stdout, a.cmd.Stderr = log, log
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { a.err = a.cmd.Wait(); log.Close(); close(a.exited) }()
	lease := gpuinfo.AgentLeasePrefix + node
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-a.exited:
			raw, _ := os.ReadFile(filepath.Join(suite.dir, "agent.log"))
			return false, fmt.Errorf("the node agent exited: %v; its log:\n%s", a.err, raw)
		default:
		}
		l, err := suite.cp.Client.CoordinationV1().Leases(manifests.Namespace).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, notReady := l.Annotations[gpuinfo.AgentNotReadyAnnotation]
		return !notReady && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < 5*time.Second, nil
	})
	if err != nil {
		a.stop()
		return nil, fmt.Errorf("waiting for the node agent to be ready: %w", err)
	}
	return a, nil
}

// stop stops the agent as its DaemonSet's pod is stopped (SIGTERM) and
// waits for it to exit.
func (a *agentProcess) stop() {
	_ = a.cmd.Process.Signal(os.Interrupt)
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
}
