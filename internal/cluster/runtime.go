package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/hamicore"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	noderesize "github.com/tessera-gpu/tessera/node-agent/resize"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// SimulatedRuntime plays a simulated node's container runtime for the node
// agent's resize applier: every container of a pod bound to the node that
// holds shares of cards runs, with a shared region in Dir initialised as
// HAMi-core would initialise it from the container's environment, and its
// processes use no GPU memory.
type SimulatedRuntime struct {
	Client kubernetes.Interface
	Node   string
	Dir    string

	mu sync.Mutex
	// resized are the shares the applier recorded, by container ID.
	resized map[string][]gpuinfo.CardAssignment
}

// containerID is the simulated runtime ID of a pod's container.
func containerID(pod *v1.Pod, container string) string {
	return "sim-" + string(pod.UID) + "-" + container
}

// Running lists the shared containers of the node's pods, creating their
// regions as their first process would.
func (s *SimulatedRuntime) Running() []nri.Running {
	pods, err := s.Client.CoreV1().Pods(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.Node).String(),
	})
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []nri.Running
	for i := range pods.Items {
		pod := &pods.Items[i]
		a, err := gpuinfo.DecodeAssignment(pod.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil || pod.DeletionTimestamp != nil {
			continue
		}
		for name, cards := range a.Containers {
			if len(cards) == 0 || cards[0].Cores >= gpuinfo.FullCores || cards[0].MIG != nil {
				continue
			}
			id := containerID(pod, name)
			if held, ok := s.resized[id]; ok {
				cards = held
			}
			if err := s.ensureRegion(id, cards); err != nil {
				continue
			}
			out = append(out, nri.Running{ID: id,
				Owner:    nri.Owner{Namespace: pod.Namespace, Pod: pod.Name, PodUID: pod.UID, Container: name},
				Holdings: []enforce.Holding{{Key: enforce.ContainerKey(id), Cards: cards}}})
		}
	}
	return out
}

// ensureRegion creates the container's region, initialised with its
// shares, unless it exists.
func (s *SimulatedRuntime) ensureRegion(id string, cards []gpuinfo.CardAssignment) error {
	path := filepath.Join(s.Dir, enforce.RegionName(id))
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	memory, compute := make([]uint64, len(cards)), make([]uint64, len(cards))
	for i, c := range cards {
		memory[i], compute[i] = uint64(c.MemoryMiB)<<20, uint64(c.Cores)
	}
	return hamicore.WriteRegion(path, 1, 2, memory, compute, nil)
}

// Resized records a container's new shares.
func (s *SimulatedRuntime) Resized(id string, cards []gpuinfo.CardAssignment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resized == nil {
		s.resized = map[string][]gpuinfo.CardAssignment{}
	}
	s.resized[id] = cards
	return true
}

// Use reports that the container's processes use nothing.
func (s *SimulatedRuntime) Use(string) (map[string]int64, error) { return map[string]int64{}, nil }

// Pod reads a pod from the API, with the list the agent's role allows.
func (s *SimulatedRuntime) Pod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	list, err := s.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, apierrors.NewNotFound(v1.Resource("pods"), name)
	}
	return &list.Items[0], nil
}

// RunResizes runs the node agent's resize applier for a simulated node,
// under the agent's identity for it, with a SimulatedRuntime keeping its
// regions in dir, until ctx ends.
func (cp *ControlPlane) RunResizes(ctx context.Context, node, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	client, err := cp.AgentClient(node)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cp.AgentConfig(node))
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	rt := &SimulatedRuntime{Client: client, Node: node, Dir: dir}
	a := &noderesize.Applier{Node: node, Client: dyn, RegionDir: dir, Running: rt.Running, Resized: rt.Resized, Use: rt.Use, Pod: rt.Pod,
		ReconcileInterval: noderesize.DefaultReconcileInterval}
	go a.Run(ctx)
	return nil
}
