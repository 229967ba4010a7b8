// Package enforce turns a container's GPU assignment into the changes the
// node agent makes to it at creation: which cards it sees and the limits the
// CUDA interception library (HAMi-core's libvgpu.so) enforces inside it. It
// is pure: the NRI plugin feeds it the pod as the API server has it.
package enforce

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Paths are the host and container paths of the interception library.
type Paths struct {
	// HostLibrary is libvgpu.so on the host.
	HostLibrary string
	// HostPreload is a host file containing the library's container path,
	// mounted as /etc/ld.so.preload.
	HostPreload string
	// HostCacheDir holds the library's shared regions: one file per
	// container (per claim, with --dra), each mounted into its container
	// alone.
	HostCacheDir string
}

// DefaultPaths are the host paths used when none are configured.
func DefaultPaths() Paths {
	return Paths{
		HostLibrary:  "/usr/local/vgpu/libvgpu.so",
		HostPreload:  "/usr/local/vgpu/ld.so.preload",
		HostCacheDir: "/var/lib/tessera/vgpu-cache",
	}
}

// Container paths the library and its users expect.
const (
	containerLibrary  = "/usr/local/vgpu/libvgpu.so"
	containerPreload  = "/etc/ld.so.preload"
	containerCacheDir = "/usr/local/vgpu/cache"
)

// HAMiCoreVersion is the HAMi-core commit whose shared region and files the
// agent is written for (docs/node-agent.md): the region (layout 1.2) is the
// only file the library shares between a container's processes, and nothing
// is shared between containers (its host-wide lock file is never taken).
const HAMiCoreVersion = "8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811"

// CreateRegion creates the empty shared-region file name in the cache
// directory, or empties an old one, writable by any user of the container
// that mounts it: the library initialises an empty region from the
// environment of the container's first process, and an old one would keep
// its limits.
func (p Paths) CreateRegion(name string) error {
	path, err := p.regionPath(name)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|syscall.O_NOFOLLOW, 0o666)
	if err != nil {
		return fmt.Errorf("creating the shared region of the interception library: %w", err)
	}
	err = f.Chmod(0o666) // whatever the agent's umask
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// RemoveRegion removes the shared-region file name; one already gone is
// not an error.
func (p Paths) RemoveRegion(name string) error {
	path, err := p.regionPath(name)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// regionPath is the host path of the shared-region file name, which must be
// a plain file name.
func (p Paths) regionPath(name string) (string, error) {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("invalid shared-region file name %q", name)
	}
	return filepath.Join(p.HostCacheDir, name), nil
}

// RegionName is the shared-region file of the container with runtime ID id,
// or of the claim with UID claim (claims share one region among their
// containers).
func RegionName(id string) string { return id + regionSuffix }

// ClaimRegionName is the shared-region file of a claim.
func ClaimRegionName(claim types.UID) string { return "claim-" + string(claim) + regionSuffix }

const regionSuffix = ".cache"

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
	// MIGSpec: the agent writes the CDI spec of the slices of its dynamic
	// cards (MIGSpecWriter), which then go to containers as devices of
	// MIGSpecKind; the toolkit's spec lacks a slice made after it was
	// generated.
	MIGSpec bool
}

// CDINaming is how a CDI spec names the cards.
type CDINaming string

// The CDI device-name strategies of the NVIDIA container toolkit that the
// agent supports.
const (
	CDIByIndex CDINaming = "index"
	CDIByUUID  CDINaming = "uuid"
)

// cdiName is the CDI device name of card, or of its MIG device slice where
// the entry gives a slice ("CARD:INDEX" by index; a dynamic card's slice in
// the agent's own spec when it writes one).
func (c Config) cdiName(card gpuinfo.CardAssignment, slice SliceDevice) string {
	switch {
	case card.MIG != nil && slice.Dynamic && c.MIGSpec:
		return MIGSpecKind + "=" + migDeviceName(card.Index, slice.Index)
	case c.CDINames == CDIByUUID:
		return c.CDIKind + "=" + visibleUUID(card, slice.MIGInstance)
	case card.MIG != nil:
		return c.CDIKind + "=" + migDeviceName(card.Index, slice.Index)
	}
	return c.CDIKind + "=" + strconv.Itoa(card.Index)
}

// visibleUUID is the UUID a container is given for an entry: for a slice,
// its MIG device's as the node has it now (slice), else the card's.
func visibleUUID(card gpuinfo.CardAssignment, slice gpuinfo.MIGInstance) string {
	if card.MIG != nil {
		return slice.UUID
	}
	return card.UUID
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
	// Region is the shared-region file (in the cache directory) to create
	// before the container starts; "" when it gets none.
	Region string
	// Holdings are the shares of cards the container gets: by its
	// assignment, or by its Tessera claims (whose CDI devices then hand
	// them over, with no change made here). None for a container without
	// cards.
	Holdings []Holding
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

// Node is what the agent knows of its node when it adjusts a container.
type Node struct {
	// Name is the node's name.
	Name string
	// Cards are the node's cards as the agent last discovered them; nil
	// before the first scan.
	Cards []discovery.Card
	// Claims reads the ResourceClaims a container uses.
	Claims ClaimGetter
	// MIGCaps reads the node's MIG capability devices (ReadMIGCaps); nil
	// allows none.
	MIGCaps func() (MIGCaps, error)
}

// SliceDevice is the MIG device of an entry that gives a slice, as the node
// has it now.
type SliceDevice struct {
	gpuinfo.MIGInstance
	// Dynamic: its card is dynamic, its slices Tessera's to make.
	Dynamic bool
}

// slices are the MIG devices of the entries' slices as the node's cards
// have them now (zero for whole cards); checkCards has found them.
func (n Node) slices(cards []gpuinfo.CardAssignment) []SliceDevice {
	devices := make([]SliceDevice, len(cards))
	for i, want := range cards {
		if card, ok := n.card(want.Index); ok && want.MIG != nil {
			if in, _ := card.Slice(want.MIG.Profile, want.MIG.Start); in != nil {
				devices[i] = SliceDevice{*in, card.MIGDynamic}
			}
		}
	}
	return devices
}

// card is the node's card with index i.
func (n Node) card(i int) (discovery.Card, bool) {
	for _, c := range n.Cards {
		if c.Index == i {
			return c, true
		}
	}
	return discovery.Card{}, false
}

// For returns the adjustment for container of pod, as created on node by a
// sandbox of uid under the runtime's container ID id. A container that asks for no GPUs gets NoGPU, unless it
// uses a claim of Tessera's driver allocated on this node and reserved for
// this pod: it is left as that claim's CDI devices make it. It returns an
// error — the container must not start — when the pod is not bound to this
// node under that UID, or when the container asks for GPUs and the pod has
// no valid assignment for it, or one naming cards this node does not have as
// named, or an invalid annotation.
func (c Config) For(pod *v1.Pod, uid types.UID, container, id string, node Node) (*Adjustment, error) {
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
		holdings, err := claimHoldings(pod, uid, container, node)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s, container %q: %w", pod.Namespace, pod.Name, container, err)
		}
		if len(holdings) > 0 {
			// Its Tessera claims' CDI devices, from the DRA driver, decide
			// which cards it sees and with what limits.
			return &Adjustment{Holdings: holdings}, nil
		}
		return NoGPU(), nil
	}
	if err := boundHere(pod, uid, node.Name); err != nil {
		return nil, err
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
	if err := node.checkCards(cards); err != nil {
		return nil, fmt.Errorf("pod %s/%s: container %q: %s: %w", pod.Namespace, pod.Name, container, gpuinfo.AssignmentAnnotation, err)
	}
	adj := c.Cards(cards, node.slices(cards), heldWhole(cr, cards), RegionName(id), c.taskPriority(pod, req.TaskPriority))
	// Not a claim's: a value from the pod spec would make the agent count
	// its cards as another claim's when it reads them back (runningHoldings).
	adj.Env = append(adj.Env, EnvVar{ClaimEnv, ""})
	adj.Holdings = []Holding{{Key: ContainerKey(id), Cards: cards}}
	return adj, nil
}

// heldWhole reports whether a container holds its devices whole, so needs no
// interception: MIG slices of its own (fenced in hardware), or whole cards
// asked for without a memory limit. Slices are read from the assignment,
// which only the scheduler writes, never from the pod's annotations, which
// its owner may change after the pod was placed.
func heldWhole(cr *gpuinfo.ContainerRequest, cards []gpuinfo.CardAssignment) bool {
	slices := 0
	for _, card := range cards {
		if card.MIG != nil {
			if card.Cores < gpuinfo.FullCores {
				return false
			}
			slices++
		}
	}
	if slices > 0 {
		return slices == len(cards)
	}
	return cr.Exclusive() && cr.MemoryMiB == 0 && cr.MemoryPercent == 0
}

// boundHere refuses a pod that is not bound to node under uid: its
// assignment or claims are not this sandbox's to use.
func boundHere(pod *v1.Pod, uid types.UID, node string) error {
	switch {
	case pod.UID != uid:
		return fmt.Errorf("pod %s/%s: the API's pod has UID %s, the sandbox %s; refusing to give GPUs to another pod's container", pod.Namespace, pod.Name, pod.UID, uid)
	case pod.Spec.NodeName != node:
		return fmt.Errorf("pod %s/%s is bound to node %q, not %q", pod.Namespace, pod.Name, pod.Spec.NodeName, node)
	}
	return nil
}

// checkCards refuses cards that are not the node's own as named (the index
// and UUID of one card) or a share larger than the card.
func (n Node) checkCards(cards []gpuinfo.CardAssignment) error {
	if n.Cards == nil {
		return errors.New("the node agent has not discovered this node's cards yet (kubelet will retry)")
	}
	for _, want := range cards {
		card, ok := n.card(want.Index)
		switch {
		case !ok:
			return fmt.Errorf("card %d: node %s has no card with that index", want.Index, n.Name)
		case card.UUID != want.UUID:
			return fmt.Errorf("card %d: its UUID on node %s is %s, not %s", want.Index, n.Name, card.UUID, want.UUID)
		case want.MIG != nil:
			if err := checkSlice(want, card); err != nil {
				return err
			}
		case card.MIGEnabled:
			return fmt.Errorf("card %d (%s) is in MIG mode: only its MIG slices can be given", want.Index, want.UUID)
		case want.MemoryMiB > card.MemoryMiB:
			return fmt.Errorf("card %d (%s): %d MiB is more than the card's %d MiB", want.Index, want.UUID, want.MemoryMiB, card.MemoryMiB)
		}
	}
	return nil
}

// checkSlice refuses a MIG slice the card does not have now as named: its
// profile at its start, under its MIG device UUID (on a dynamic card, a
// slice created for the pod after it was placed, whatever UUID it got),
// with the memory asked for.
func checkSlice(want gpuinfo.CardAssignment, card discovery.Card) error {
	in, p := card.Slice(want.MIG.Profile, want.MIG.Start)
	switch {
	case in == nil:
		return fmt.Errorf("card %d (%s) has no MIG slice %s at slot %d", want.Index, want.UUID, want.MIG.Profile, want.MIG.Start)
	case card.MIGDynamic:
		// Its slices are made for the pods that hold them, and made again
		// under another UUID if one went while no pod held it yet.
	case want.MIG.UUID == "":
		return fmt.Errorf("card %d (%s): the assignment names no MIG device for slice %s at slot %d, and the card is not dynamic", want.Index, want.UUID, want.MIG.Profile, want.MIG.Start)
	case in.UUID != want.MIG.UUID:
		return fmt.Errorf("card %d: its MIG slice %s at slot %d is %s, not %q", want.Index, want.MIG.Profile, want.MIG.Start, in.UUID, want.MIG.UUID)
	case want.MemoryMiB > p.MemoryMiB:
		return fmt.Errorf("card %d, MIG slice %s (%s): %d MiB is more than the slice's %d MiB", want.Index, want.MIG.Profile, in.UUID, want.MemoryMiB, p.MemoryMiB)
	}
	return nil
}

// ContainerKey is the Holding key of the container with runtime ID id.
func ContainerKey(id string) string { return "container/" + id }

// ClaimKey is the Holding key of a claim.
func ClaimKey(claim types.UID) string { return "claim/" + string(claim) }

// Holding is a share of cards and what holds it: one container's
// assignment, or one claim (which all the containers using it share).
type Holding struct {
	// Key names the holder: ContainerKey or ClaimKey.
	Key string
	// Cards are the cards held, each with its share.
	Cards []gpuinfo.CardAssignment
}

// Cards is the adjustment that gives a container cards: visible by UUID (and
// as CDI devices when CDIKind is set; an entry that gives a MIG slice by its
// MIG device in slices, parallel to cards and nil where there are none) and, unless whole, limited to each
// card's share by the interception library, whose shared region is the file
// region of the cache directory, mounted into the container alone (the
// caller creates it first: Region). taskPriority is the library's
// CUDA_TASK_PRIORITY, "0" (high) or "1" (low). Whole cards get no
// interception, so no overhead.
func (c Config) Cards(cards []gpuinfo.CardAssignment, slices []SliceDevice, whole bool, region, taskPriority string) *Adjustment {
	uuids := make([]string, len(cards))
	adj := &Adjustment{}
	for i, card := range cards {
		var slice SliceDevice
		if i < len(slices) {
			slice = slices[i]
		}
		uuids[i] = visibleUUID(card, slice.MIGInstance)
		if c.CDIKind != "" {
			adj.CDIDevices = append(adj.CDIDevices, c.cdiName(card, slice))
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
		// Compute inside a MIG slice is not limited: HAMi-core's
		// throttling reads utilisation NVML does not report for slices.
		belowFull = belowFull || card.Cores < gpuinfo.FullCores && card.MIG == nil
	}
	containerRegion := containerCacheDir + "/" + region
	adj.Env = append(adj.Env, EnvVar{"CUDA_DEVICE_MEMORY_SHARED_CACHE", containerRegion})
	if belowFull {
		adj.Env = append(adj.Env, EnvVar{"GPU_CORE_UTILIZATION_POLICY", "force"})
	}
	adj.Env = append(adj.Env, EnvVar{taskPriorityEnv, taskPriority})
	adj.Region = region
	adj.Mounts = []Mount{
		{Source: c.Paths.HostLibrary, Destination: containerLibrary, ReadOnly: true},
		{Source: c.Paths.HostPreload, Destination: containerPreload, ReadOnly: true},
		{Source: filepath.Join(c.Paths.HostCacheDir, region), Destination: containerRegion},
	}
	return adj
}
