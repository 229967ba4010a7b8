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

// Mount is a bind mount into the container.
type Mount struct {
	Source, Destination string
	ReadOnly            bool
}

// Adjustment is what the agent adds to a container.
type Adjustment struct {
	// Env are environment variables, in a stable order.
	Env []EnvVar
	// Mounts are bind mounts.
	Mounts []Mount
}

// EnvVar is one environment variable.
type EnvVar struct{ Name, Value string }

// NoGPU is the adjustment of a container that asks for no GPUs: the NVIDIA
// container toolkit then exposes no card to it, whatever its image sets
// (CUDA base images set NVIDIA_VISIBLE_DEVICES=all).
func NoGPU() *Adjustment {
	return &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", "void"}}}
}

// For returns the adjustment for container of pod, as created on node by a
// sandbox of uid. A container that asks for no GPUs gets NoGPU. It returns an
// error — the container must not start — when the pod is not bound to this
// node under that UID, or when the container asks for GPUs and the pod has
// no valid assignment for it.
func For(pod *v1.Pod, uid types.UID, container, node string, names gpuinfo.ResourceNames, paths Paths) (*Adjustment, error) {
	req, err := gpuinfo.ParsePodRequest(pod, names)
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
	uuids := make([]string, len(cards))
	for i, c := range cards {
		uuids[i] = c.UUID
	}
	adj := &Adjustment{Env: []EnvVar{{"NVIDIA_VISIBLE_DEVICES", strings.Join(uuids, ",")}}}
	if cr.Exclusive() && cr.MemoryMiB == 0 && cr.MemoryPercent == 0 {
		return adj, nil // whole cards: no interception, no overhead
	}
	for i, c := range cards {
		n := strconv.Itoa(i)
		adj.Env = append(adj.Env,
			EnvVar{"CUDA_DEVICE_MEMORY_LIMIT_" + n, strconv.FormatInt(c.MemoryMiB, 10) + "m"},
			EnvVar{"CUDA_DEVICE_SM_LIMIT_" + n, strconv.FormatInt(c.Cores, 10)})
	}
	cacheFile := string(pod.UID) + "_" + container + ".cache"
	adj.Env = append(adj.Env, EnvVar{"CUDA_DEVICE_MEMORY_SHARED_CACHE", filepath.Join(containerCacheDir, cacheFile)})
	if cr.Cores < gpuinfo.FullCores {
		adj.Env = append(adj.Env, EnvVar{"GPU_CORE_UTILIZATION_POLICY", "force"})
	}
	adj.Mounts = []Mount{
		{Source: paths.HostLibrary, Destination: containerLibrary, ReadOnly: true},
		{Source: paths.HostPreload, Destination: containerPreload, ReadOnly: true},
		{Source: paths.HostCacheDir, Destination: containerCacheDir},
		{Source: paths.HostLockDir, Destination: containerLockDir},
	}
	return adj, nil
}
