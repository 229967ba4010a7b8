// Package nri is the node agent's NRI plugin: at container creation the
// runtime (containerd >= 1.7, CRI-O) hands it the pod's namespace, name and
// UID and the container's name, so the agent applies exactly that
// container's entry of the pod's GPU assignment — no guessing, no node lock.
package nri

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// PodGetter returns a pod as the API server has it (an informer's lister).
type PodGetter func(namespace, name string) (*v1.Pod, error)

// Plugin adjusts containers at creation.
type Plugin struct {
	Node  string
	Names gpuinfo.ResourceNames
	Paths enforce.Paths
	Pods  PodGetter
	// PodWait bounds how long a container creation waits for its pod to
	// reach the agent's informer.
	PodWait time.Duration
}

// CreateContainer applies the container's GPU assignment. A container that
// asks for GPUs without a valid assignment for this node and pod fails to
// start, with the reason.
func (p *Plugin) CreateContainer(ctx context.Context, sandbox *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	pod, err := p.pod(ctx, sandbox.Namespace, sandbox.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("tessera: container %q of pod %s/%s: %w", ctr.Name, sandbox.Namespace, sandbox.Name, err)
	}
	adj, err := enforce.For(pod, types.UID(sandbox.Uid), ctr.Name, p.Node, p.Names, p.Paths)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Refusing to start container without its GPU assignment", "pod", klog.KObj(pod), "container", ctr.Name)
		return nil, nil, fmt.Errorf("tessera: %w", err)
	}
	if adj == nil {
		return nil, nil, nil
	}
	out := &api.ContainerAdjustment{}
	for _, e := range adj.Env {
		out.AddEnv(e.Name, e.Value)
	}
	for _, m := range adj.Mounts {
		options := []string{"rbind", "rw"}
		if m.ReadOnly {
			options = []string{"rbind", "ro"}
		}
		out.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: options})
	}
	klog.FromContext(ctx).V(2).Info("Applied GPU assignment", "pod", klog.KObj(pod), "container", ctr.Name)
	return out, nil, nil
}

// pod waits up to PodWait for the pod to reach the agent's informer.
func (p *Plugin) pod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, p.PodWait, true, func(context.Context) (bool, error) {
		got, err := p.Pods(namespace, name)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod = got
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("pod not found in the API within %v: %w", p.PodWait, err)
	}
	return pod, nil
}

// Run connects to the runtime's NRI socket and serves until ctx ends.
func (p *Plugin) Run(ctx context.Context, socket string) error {
	s, err := stub.New(p, stub.WithPluginName("tessera-gpu"), stub.WithPluginIdx("50"), stub.WithSocketPath(socket))
	if err != nil {
		return fmt.Errorf("creating the NRI plugin: %w", err)
	}
	return s.Run(ctx)
}

// WatchPodsOnNode starts an informer over the pods bound to node — the only
// pods whose containers the runtime on that node creates — and returns a
// getter reading its cache once it has synced. It fails if the cache cannot
// sync before ctx ends (for example, when the agent may not list pods).
func WatchPodsOnNode(ctx context.Context, client kubernetes.Interface, node string) (PodGetter, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	lister := factory.Core().V1().Pods().Lister()
	factory.Start(ctx.Done())
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return nil, fmt.Errorf("the informer of %v on node %s did not sync: %w", typ, node, context.Cause(ctx))
		}
	}
	return func(namespace, name string) (*v1.Pod, error) { return lister.Pods(namespace).Get(name) }, nil
}
