//go:build e2enode

package e2enode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// image is the test's only image, built by tools/e2e-image: /workload waits
// for SIGTERM; its environment is a CUDA base image's
// (NVIDIA_VISIBLE_DEVICES=all) plus values the agent must override.
const image = "docker.io/tessera/e2e-workload:v1"

// containerdConfig is the runtime's configuration: everything under one
// directory, NRI on (its socket is the agent's), the native snapshotter
// (works on any filesystem), the test image as the sandbox image, runc from
// the host, CDI specs from the test's directory, no CNI (every sandbox
// uses the host network), and OOM score adjustments no lower than
// containerd's own (a VM or container may not grant lowering them).
var containerdConfig = template.Must(template.New("config").Parse(`version = 3
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{{.Dir}}/containerd.sock"
[ttrpc]
  address = "{{.Dir}}/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins.'io.containerd.internal.v1.opt']
  path = "{{.Dir}}/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{{.Dir}}/nri.sock"
  plugin_path = "{{.Dir}}/nri-plugins"
  plugin_config_path = "{{.Dir}}/nri-conf"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{{.Image}}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{{.Dir}}/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{{.Runc}}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{{.Dir}}/cni-bin"]
    conf_dir = "{{.Dir}}/cni-conf"
`))

// containerd is a containerd started by the test, and its CRI.
type containerd struct {
	dir     string
	cmd     *exec.Cmd
	log     *os.File
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	// Version is the runtime's name and version, as CRI reports them.
	Version string
}

// startContainerd starts bin/containerd with its state under dir, imports
// the test image and connects to its CRI.
func startContainerd(ctx context.Context, bin, dir, runc string, cdiSpecs map[string]string) (*containerd, error) {
	for _, d := range []string{"cdi", "nri-plugins", "nri-conf", "cni-bin", "cni-conf"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	for file, spec := range cdiSpecs {
		if err := os.WriteFile(filepath.Join(dir, "cdi", file), []byte(spec), 0o644); err != nil {
			return nil, err
		}
	}
	var cfg bytes.Buffer
	if err := containerdConfig.Execute(&cfg, map[string]string{"Dir": dir, "Image": image, "Runc": runc}); err != nil {
		return nil, err
	}
	config := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(config, cfg.Bytes(), 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		return nil, err
	}
	c := &containerd{dir: dir, log: log}
	c.cmd = exec.Command(filepath.Join(bin, "containerd"), "--config", config)
	// containerd finds its shim on PATH.
	c.cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	c.cmd.Stdout, c.cmd.Stderr = log, log
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting containerd: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	socket := filepath.Join(dir, "containerd.sock")
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("containerd exited: %v; its log:\n%s", err, c.logTail())
		default:
		}
		_, err := os.Stat(socket)
		return err == nil, nil
	}); err != nil {
		c.stop()
		return nil, fmt.Errorf("waiting for containerd's socket: %w", err)
	}
	imp := exec.CommandContext(ctx, filepath.Join(bin, "ctr"), "--address", socket, "--namespace", "k8s.io",
		"images", "import", "--local", "--platform", "linux/amd64", "--snapshotter", "native", filepath.Join(bin, "e2e-image.tar"))
	if out, err := imp.CombinedOutput(); err != nil {
		c.stop()
		return nil, fmt.Errorf("importing the test image: %v: %s", err, out)
	}
	if c.conn, err = grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		c.stop()
		return nil, err
	}
	c.runtime = runtimeapi.NewRuntimeServiceClient(c.conn)
	v, err := c.runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("CRI version: %w", err)
	}
	c.Version = v.RuntimeName + " " + v.RuntimeVersion
	return c, nil
}

// logTail is the end of containerd's log.
func (c *containerd) logTail() string {
	raw, _ := os.ReadFile(c.log.Name())
	if len(raw) > 4000 {
		raw = raw[len(raw)-4000:]
	}
	return string(raw)
}

// stop removes every sandbox and stops containerd.
func (c *containerd) stop() {
	if c.runtime != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if list, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, sb := range list.Items {
				_, _ = c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id})
				_, _ = c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id})
			}
		}
	}
	if c.conn != nil {
		_ = c.conn.Close()
	}
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _, _ = c.cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = c.cmd.Process.Kill()
		}
	}
	_ = c.log.Close()
}

// sandbox is a pod's sandbox, as kubelet runs it for a host-network pod
// (no hostname of its own): the pod's name, namespace and UID.
type sandbox struct {
	id     string
	config *runtimeapi.PodSandboxConfig
}

// runSandbox runs the sandbox of a pod under uid, with the pod's
// annotations, all of them, as kubelet passes them (newPodAnnotations).
func (c *containerd) runSandbox(ctx context.Context, pod *v1.Pod, uid string) (*sandbox, error) {
	namespace, name := pod.Namespace, pod.Name
	config := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		Annotations:  pod.Annotations,
		LogDirectory: filepath.Join(c.dir, "logs", namespace+"_"+name+"_"+uid),
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
		}},
	}
	// Privileged when a container is, as kubelet sets it.
	for _, c := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			config.Linux.SecurityContext.Privileged = true
		}
	}
	if err := os.MkdirAll(config.LogDirectory, 0o755); err != nil {
		return nil, err
	}
	resp, err := c.runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: config})
	if err != nil {
		return nil, err
	}
	return &sandbox{id: resp.PodSandboxId, config: config}, nil
}

// running is a started container: its OCI spec as the runtime created it,
// and the environment and /dev of its process.
type running struct {
	id      string
	spec    rspec.Spec
	environ map[string]string
	pid     int
}

// extra is what a container gets besides its pod spec: CDI devices (from
// its claims, as kubelet passes their prepared devices) and annotations
// (kubelet passes only a device plugin's and its own; a test adds one to
// show what a runtime honouring a pod's CDI annotations would do).
type extra struct {
	cdiDevices  []string
	annotations map[string]string
}

// createContainer creates the pod's container name in the sandbox from the
// test image, as kubelet does: the environment and privilege the pod spec
// gives it, kubelet's own container annotations (newContainerAnnotations:
// never the pod's), and the extra CDI devices and annotations. It returns
// CreateContainer's error as is: the agent's refusals come back in it.
func (c *containerd) createContainer(ctx context.Context, sb *sandbox, pod *v1.Pod, name string, x extra) (string, error) {
	env := map[string]string{}
	privileged := false
	for _, spec := range append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if spec.Name == name {
			for _, e := range spec.Env {
				env[e.Name] = e.Value
			}
			privileged = spec.SecurityContext != nil && spec.SecurityContext.Privileged != nil && *spec.SecurityContext.Privileged
		}
	}
	config := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		LogPath:  name + ".log",
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     "1",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
		},
	}
	for k, v := range x.annotations {
		config.Annotations[k] = v
	}
	if privileged {
		config.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}
	}
	for k, v := range env {
		config.Envs = append(config.Envs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	for _, d := range x.cdiDevices {
		config.CDIDevices = append(config.CDIDevices, &runtimeapi.CDIDevice{Name: d})
	}
	resp, err := c.runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.id, Config: config, SandboxConfig: sb.config})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

// start starts a created container and reads what it runs with.
func (c *containerd) start(ctx context.Context, id string) (*running, error) {
	if _, err := c.runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return nil, err
	}
	status, err := c.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, err
	}
	var info struct {
		Pid         int        `json:"pid"`
		RuntimeSpec rspec.Spec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(status.Info["info"]), &info); err != nil {
		return nil, fmt.Errorf("container %s's verbose status: %w", id, err)
	}
	// StartContainer returns once runc has released its init process, which
	// may not have exec'd the entrypoint yet; until it has, its environ is
	// runc's own.
	if err := waitForExec(ctx, info.Pid, info.RuntimeSpec.Process.Args[0]); err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", info.Pid))
	if err != nil {
		return nil, err
	}
	r := &running{id: id, spec: info.RuntimeSpec, environ: map[string]string{}, pid: info.Pid}
	for _, kv := range strings.Split(string(raw), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			r.environ[k] = v
		}
	}
	return r, nil
}

// waitForExec waits until process pid runs the program entrypoint.
func waitForExec(ctx context.Context, pid int, entrypoint string) error {
	var argv0 string
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			return false, err
		}
		argv0, _, _ = strings.Cut(string(raw), "\x00")
		return argv0 == entrypoint, nil
	})
	if err != nil {
		return fmt.Errorf("process %d still runs %q, not the entrypoint %q: %w", pid, argv0, entrypoint, err)
	}
	return nil
}

// devices lists the /dev/nvidia* entries the container's process sees.
func (r *running) devices() []string {
	entries, _ := filepath.Glob(fmt.Sprintf("/proc/%d/root/dev/nvidia*", r.pid))
	for i, e := range entries {
		entries[i] = filepath.Base(e)
	}
	return entries
}

// mounts returns the container's bind mounts by destination.
func (r *running) mounts() map[string]rspec.Mount {
	m := map[string]rspec.Mount{}
	for _, mount := range r.spec.Mounts {
		m[mount.Destination] = mount
	}
	return m
}
