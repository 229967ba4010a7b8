// Package enforce turns a container's GPU assignment into the changes the
// node agent makes to it at creation: which cards it sees and the limits the
// CUDA interception library (HAMi-core's libvgpu.so) enforces inside it. It
// is pure: the NRI plugin feeds it the pod as the API server has it.
package enforce

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Paths are the host and container paths of the interception library.
type Paths struct {
	// HostLibrary is libvgpu.so on the host.
	HostLibrary string
	// HostPreload is a host file containing the library's container path,
	// mounted as /etc/ld.so.preload.
	HostPreload string
	// HostCacheDir holds one shared-cache file per container.
	HostCacheDir string
	// HostLockDir is the lock directory the library expects.
	HostLockDir string
}

// DefaultPaths are the host paths used when none are configured.
func DefaultPaths() Paths {
	return Paths{
		HostLibrary:  "/usr/local/vgpu/libvgpu.so",
		HostPreload:  "/usr/local/vgpu/ld.so.preload",
		HostCacheDir: "/var/lib/tessera/vgpu-cache",
		HostLockDir:  "/tmp/vgpulock",
	}
}

// Container paths the library and its users expect.
const (
	containerLibrary  = "/usr/local/vgpu/libvgpu.so"
	containerPreload  = "/etc/ld.so.preload"
	containerCacheDir = "/usr/local/vgpu/cache"
	containerLockDir  = "/tmp/vgpulock"
)

// WritePreload makes the host's preload file name the library as the
// container sees it, so that mounting it as /etc/ld.so.preload loads the
// library into every process. It rewrites the file only when it differs.
func (p Paths) WritePreload() error {
	want := containerLibrary + "\n"
	if got, err := os.ReadFile(p.HostPreload); err == nil && string(got) == want {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p.HostPreload), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p.HostPreload, []byte(want), 0o644)
}

// DefaultHighTaskPriority is the pod priority from which shared-card
// containers get the high task priority: the value of the PriorityClass
// tessera-critical that the manifests ship.
const DefaultHighTaskPriority = 100000

// Config is what the agent adds to the pod to decide a container's changes.
type Config struct {
	// Names are the resource names pods ask for GPUs with.
	Names gpuinfo.ResourceNames
	// Paths locate the interception library.
	Paths Paths
	// HighTaskPriority is the pod priority (spec.priority) from which a
	// shared-card container computes first on its cards; below it, its
	// kernels wait while a high-priority task computes there.
	HighTaskPriority int32
	// CDIKind, when set, hands the assigned cards over as CDI devices of this
	// kind ("nvidia.com/gpu"=<name>) besides NVIDIA_VISIBLE_DEVICES, so that a
	// container toolkit refusing that variable from unprivileged containers
	// still gives them their cards, and only them.
	CDIKind string
	// CDINames says how the node's CDI spec names a card: CDIByIndex (the
	// NVIDIA toolkit's default) or CDIByUUID.
	CDINames CDINaming
}

// CDINaming is how a CDI spec names the cards.
type CDINaming string

// The CDI device-name strategies of the NVIDIA container toolkit that the
// agent supports.
const (
	CDIByIndex CDINaming = "index"
	CDIByUUID  CDINaming = "uuid"
)

// cdiName is card's CDI device name.
func (c Config) cdiName(card gpuinfo.CardAssignment) string {
	if c.CDINames == CDIByUUID {
		return c.CDIKind + "=" + card.UUID
	}
	return c.CDIKind + "=" + strconv.Itoa(card.Index)
}

// DefaultCDIKind is the CDI kind of NVIDIA's cards.
const DefaultCDIKind = "nvidia.com/gpu"

// DefaultConfig is Tessera's resource names, DefaultPaths,
// DefaultHighTaskPriority and the cards as CDI devices named by index.
func DefaultConfig() Config {
	return Config{Names: gpuinfo.DefaultResourceNames(), Paths: DefaultPaths(), HighTaskPriority: DefaultHighTaskPriority, CDIKind: DefaultCDIKind, CDINames: CDIByIndex}
}

// taskPriorityEnv is the interception library's task priority variable:
// "0" high, "1" low.
const taskPriorityEnv = "CUDA_TASK_PRIORITY"

// taskPriority is the value of taskPriorityEnv for a pod's shared-card
// containers: the pod's TaskPriorityAnnotation if set, else high when the
// pod's priority reaches the threshold.
func (c Config) taskPriority(pod *v1.Pod, annotated gpuinfo.TaskPriority) string {
	high := annotated == gpuinfo.TaskPriorityHigh ||
		(annotated == "" && pod.Spec.Priority != nil && *pod.Spec.Priority >= c.HighTaskPriority)
	if high {
		return "0"
	}
	return "1"
}

// Mount is a bind mount into the container.
type Mount struct {
	Source, Destination string
	ReadOnly            bool
}

// Adjustment is what the agent adds to a container.
type Adjustment struct {
	// Env are environment variables, in a stable order.
	Env []EnvVar
	// CDIDevices are the fully qualified CDI device names of the cards.
	CDIDevices []string
	// Mounts are bind mounts.
	Mounts []Mount
}

// EnvVar is one environment variable.
type EnvVar struct{ Name, Value string }

// CheckEnv refuses an adjustment the runtime would not apply faithfully: one
// setting a variable that the container's environment (image and pod spec,
// as the runtime built it) holds more than once. containerd keeps both
// copies when the image and the spec set the same variable, and NRI replaces
// only the first: the later one, the spec's, wins, so the container would
// run with its own value instead of the agent's (a limit escaped).
func (a *Adjustment) CheckEnv(env []string) error {
	count := map[string]int{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		count[name]++
	}
	for _, e := range a.Env {
		if count[e.Name] > 1 {
			return fmt.Errorf("the container's environment sets %s %d times (its image and its pod spec); the runtime would keep the pod spec's value over the node agent's: remove it from the pod spec", e.Name, count[e.Name])
		}
	}
	return nil
}

// NoGPU is the adjustment of a container that asks for no GPUs: the NVIDIA
// container toolkit then exposes no card to it, whatever its image sets
// (CUDA base images set NVIDIA_VISIBLE_DEVICES=all).
func NoGPU() *Adjustment {
	return &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "void"}}}
}

// For returns the adjustment for container of pod, as created on node by a
// sandbox of uid. A container that asks for no GPUs gets NoGPU, unless it
// uses resource claims (DRA): it is left as its claims' CDI devices make it. It returns an
// error — the container must not start — when the pod is not bound to this
// node under that UID, or when the container asks for GPUs and the pod has
// no valid assignment for it, or an invalid annotation.
func (c Config) For(pod *v1.Pod, uid types.UID, container, node string) (*Adjustment, error) {
	req, err := gpuinfo.ParsePodRequest(pod, c.Names)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var cr *gpuinfo.ContainerRequest
	if req != nil {
		for i := range req.Containers {
			if req.Containers[i].Name == container {
				cr = &req.Containers[i]
			}
		}
	}
	if cr == nil {
		if usesClaims(pod, container) {
			// Its claims' CDI devices, from the DRA driver, decide which
			// cards it sees and with what limits.
			return &Adjustment{}, nil
		}
		return NoGPU(), nil
	}
	switch {
	case pod.UID != uid:
		return nil, fmt.Errorf("pod %s/%s: the API's pod has UID %s, the sandbox %s; refusing to give GPUs to another pod's container", pod.Namespace, pod.Name, pod.UID, uid)
	case pod.Spec.NodeName != node:
		return nil, fmt.Errorf("pod %s/%s is bound to node %q, not %q", pod.Namespace, pod.Name, pod.Spec.NodeName, node)
	}
	raw, ok := pod.Annotations[gpuinfo.AssignmentAnnotation]
	if !ok {
		return nil, fmt.Errorf("pod %s/%s: container %q asks for GPUs but the pod has no %s (was it scheduled by Tessera?)", pod.Namespace, pod.Name, container, gpuinfo.AssignmentAnnotation)
	}
	a, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	cards := a.Containers[container]
	if len(cards) != cr.Count {
		return nil, fmt.Errorf("pod %s/%s: container %q asks for %d GPUs but its assignment lists %d", pod.Namespace, pod.Name, container, cr.Count, len(cards))
	}
	whole := cr.Exclusive() && cr.MemoryMiB == 0 && cr.MemoryPercent == 0
	cacheFile := string(pod.UID) + "_" + container + ".cache"
	return c.Cards(cards, whole, cacheFile, c.taskPriority(pod, req.TaskPriority)), nil
}

// Cards is the adjustment that gives a container cards: visible by UUID (and
// as CDI devices when CDIKind is set) and, unless whole, limited to each
// card's share by the interception library, whose shared-cache file in the
// cache directory is cacheFile. taskPriority is the library's
// CUDA_TASK_PRIORITY, "0" (high) or "1" (low). Whole cards get no
// interception, so no overhead.
func (c Config) Cards(cards []gpuinfo.CardAssignment, whole bool, cacheFile, taskPriority string) *Adjustment {
	uuids := make([]string, len(cards))
	adj := &Adjustment{}
	for i, card := range cards {
		uuids[i] = card.UUID
		if c.CDIKind != "" {
			adj.CDIDevices = append(adj.CDIDevices, c.cdiName(card))
		}
	}
	adj.Env = []EnvVar{{"NVIDIA_VISIBLE_DEVICES", strings.Join(uuids, ",")}}
	if whole {
		return adj
	}
	belowFull := false
	for i, card := range cards {
		n := strconv.Itoa(i)
		adj.Env = append(adj.Env,
			EnvVar{"CUDA_DEVICE_MEMORY_LIMIT_" + n, strconv.FormatInt(card.MemoryMiB, 10) + "m"},
			EnvVar{"CUDA_DEVICE_SM_LIMIT_" + n, strconv.FormatInt(card.Cores, 10)})
		belowFull = belowFull || card.Cores < gpuinfo.FullCores
	}
	adj.Env = append(adj.Env, EnvVar{"CUDA_DEVICE_MEMORY_SHARED_CACHE", filepath.Join(containerCacheDir, cacheFile)})
	if belowFull {
		adj.Env = append(adj.Env, EnvVar{"GPU_CORE_UTILIZATION_POLICY", "force"})
	}
	adj.Env = append(adj.Env, EnvVar{taskPriorityEnv, taskPriority})
	adj.Mounts = []Mount{
		{Source: c.Paths.HostLibrary, Destination: containerLibrary, ReadOnly: true},
		{Source: c.Paths.HostPreload, Destination: containerPreload, ReadOnly: true},
		{Source: c.Paths.HostCacheDir, Destination: containerCacheDir},
		{Source: c.Paths.HostLockDir, Destination: containerLockDir},
	}
	return adj
}

// usesClaims reports whether the named container of pod uses resource claims.
func usesClaims(pod *v1.Pod, container string) bool {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == container {
				return len(list[i].Resources.Claims) > 0
			}
		}
	}
	return false
}
