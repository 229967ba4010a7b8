// Package nri is the node agent's NRI plugin: at container creation the
// runtime (containerd >= 1.7, CRI-O) hands it the pod's namespace, name and
// UID and the container's name, so the agent applies exactly that
// container's entry of the pod's GPU assignment — no guessing, no node lock.
//
// It fails closed: a container is created with cards only when the agent
// knows its pod and the pod's assignment; until the agent's pod cache has
// synced, for a pod it cannot find within the runtime's request timeout,
// and for an invalid assignment, the creation fails with the reason and
// kubelet retries it. Every other container is told to see no card. The
// plugin reconnects when the runtime drops it and reports, through NotReady,
// whether it can enforce at all, so the agent stops vouching for the node.
package nri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
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
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/enforce"
)

// PodGetter returns a pod as the API server has it (an informer's lister).
type PodGetter func(namespace, name string) (*v1.Pod, error)

// Reasons NotReady gives before the plugin can enforce.
const (
	reasonNotConnected = "NRI plugin not connected to the container runtime"
	reasonNoPodCache   = "pod cache not synced"
)

// Plugin adjusts containers at creation.
type Plugin struct {
	Node string
	// Enforce decides each container's changes.
	Enforce enforce.Config
	// Unrestricted are namespaces whose containers are left as they are
	// (the GPU Operator's, whose exporters see every card).
	Unrestricted []string
	// PodWait bounds how long a creation waits for its pod to reach the
	// pod cache; it is cut to half of what is left of the runtime's request
	// timeout, so the answer always arrives in time.
	PodWait time.Duration
	// RetryMax caps the wait between reconnection attempts (30 s if zero).
	RetryMax time.Duration

	pods atomic.Pointer[PodGetter]
	// dial replaces the unix-socket dialer in tests.
	dial func(socket string) (net.Conn, error)

	mu        sync.Mutex
	connected bool
	lastErr   error
	since     time.Time
	changes   chan struct{}
}

// SetPods gives the plugin its pod cache, once synced. Until then every
// container outside the unrestricted namespaces fails to start.
func (p *Plugin) SetPods(pods PodGetter) {
	p.pods.Store(&pods)
	p.changed()
}

// NotReady says why the plugin cannot enforce assignments now, or "" when
// it can: it is connected to the runtime and its pod cache has synced.
func (p *Plugin) NotReady() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.connected && p.lastErr != nil:
		return fmt.Sprintf("%s since %s: %v", reasonNotConnected, p.since.UTC().Format(time.RFC3339), p.lastErr)
	case !p.connected:
		return reasonNotConnected
	case p.pods.Load() == nil:
		return reasonNoPodCache
	}
	return ""
}

// Changes is signalled (without blocking, coalesced) whenever NotReady's
// answer may have changed.
func (p *Plugin) Changes() <-chan struct{} { return p.changesChan() }

func (p *Plugin) changesChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changes == nil {
		p.changes = make(chan struct{}, 1)
	}
	return p.changes
}

func (p *Plugin) changed() {
	select {
	case p.changesChan() <- struct{}{}:
	default:
	}
}

func (p *Plugin) setConnected(connected bool, err error) {
	p.mu.Lock()
	if connected != p.connected || err != nil {
		p.since = time.Now()
	}
	p.connected, p.lastErr = connected, err
	p.mu.Unlock()
	p.changed()
}

// Synchronize is the runtime's first call after the plugin registered.
func (p *Plugin) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	p.setConnected(true, nil)
	return nil, nil
}

// CreateContainer applies the container's GPU assignment, or hides every
// card from a container that asks for none. A container that asks for GPUs
// without a valid assignment for this node and pod — or whose pod the agent
// does not know in time — fails to start, with the reason.
func (p *Plugin) CreateContainer(ctx context.Context, sandbox *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if slices.Contains(p.Unrestricted, sandbox.Namespace) {
		return nil, nil, nil
	}
	pod, err := p.pod(ctx, sandbox.Namespace, sandbox.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("tessera: container %q of pod %s/%s: %w", ctr.Name, sandbox.Namespace, sandbox.Name, err)
	}
	adj, err := p.Enforce.For(pod, types.UID(sandbox.Uid), ctr.Name, p.Node)
	if err == nil {
		err = adj.CheckEnv(ctr.Env)
		if err != nil {
			err = fmt.Errorf("pod %s/%s, container %q: %w", pod.Namespace, pod.Name, ctr.Name, err)
		}
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Refusing to start container", "pod", klog.KObj(pod), "container", ctr.Name)
		return nil, nil, fmt.Errorf("tessera: %w", err)
	}
	if len(adj.Env) == 0 {
		klog.FromContext(ctx).V(2).Info("Left container to its resource claims", "pod", klog.KObj(pod), "container", ctr.Name)
		return nil, nil, nil
	}
	out := &api.ContainerAdjustment{}
	for _, e := range adj.Env {
		out.AddEnv(e.Name, e.Value)
	}
	for _, name := range adj.CDIDevices {
		out.AddCDIDevice(&api.CDIDevice{Name: name})
	}
	for _, m := range adj.Mounts {
		options := []string{"rbind", "rw"}
		if m.ReadOnly {
			options = []string{"rbind", "ro"}
		}
		out.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: options})
	}
	klog.FromContext(ctx).V(2).Info("Adjusted container", "pod", klog.KObj(pod), "container", ctr.Name, "visibleDevices", adj.Env[0].Value)
	return out, nil, nil
}

// pod waits for the pod to reach the pod cache, within PodWait and half of
// the runtime's remaining request time.
func (p *Plugin) pod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	getter := p.pods.Load()
	if getter == nil {
		return nil, errors.New("the node agent is starting (its pod cache has not synced); kubelet will retry")
	}
	timeout := p.PodWait
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline)/2)
	}
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got, err := (*getter)(namespace, name)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod = got
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("no pod bound to node %s found in the API within %v (kubelet will retry): %w", p.Node, timeout.Round(time.Millisecond), err)
	}
	return pod, nil
}

// Run connects to the runtime's NRI socket and serves until ctx ends. When
// the runtime drops the connection (a restart, a request that timed out) it
// connects again, waiting longer after each failure up to RetryMax.
func (p *Plugin) Run(ctx context.Context, socket string) {
	logger := klog.FromContext(ctx)
	retryMax := p.RetryMax
	if retryMax == 0 {
		retryMax = 30 * time.Second
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: retryMax}
	for {
		started := time.Now()
		err := p.serve(ctx, socket)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the runtime closed the connection")
		}
		p.setConnected(false, err)
		if time.Since(started) > time.Minute {
			backoff.Duration, backoff.Steps = 500*time.Millisecond, 1<<30
		}
		delay := backoff.Step()
		logger.Error(err, "NRI plugin disconnected: GPU containers on this node cannot start until it reconnects", "retryIn", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

func (p *Plugin) serve(ctx context.Context, socket string) error {
	opts := []stub.Option{stub.WithPluginName("tessera-gpu"), stub.WithPluginIdx("50"), stub.WithSocketPath(socket)}
	if p.dial != nil {
		opts = append(opts, stub.WithDialer(p.dial))
	}
	s, err := stub.New(p, opts...)
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
	lister, err := PodsOnNode(ctx, client, node)
	if err != nil {
		return nil, err
	}
	return func(namespace, name string) (*v1.Pod, error) { return lister.Pods(namespace).Get(name) }, nil
}

// PodsOnNode is WatchPodsOnNode's informer, as a lister of its cache: the
// node agent's one watch of its pods serves both enforcement and metrics.
func PodsOnNode(ctx context.Context, client kubernetes.Interface, node string) (corelisters.PodLister, error) {
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
	return lister, nil
}
