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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// PodGetter returns a pod as the API server has it (an informer's lister).
type PodGetter func(namespace, name string) (*v1.Pod, error)

// Reasons NotReady gives before the plugin can enforce.
const (
	reasonNotConnected = "NRI plugin not connected to the container runtime"
	reasonNoPodCache   = "pod cache not synced"
	reasonNoCards      = "the node's cards not discovered yet"
)

// Plugin adjusts containers at creation.
type Plugin struct {
	Node string
	// Enforce decides each container's changes.
	Enforce enforce.Config
	// MIGCaps reads the node's MIG capability devices
	// (enforce.ReadMIGCaps); nil allows none.
	MIGCaps func() (enforce.MIGCaps, error)
	// Unrestricted are the service accounts ("namespace:name") whose pods'
	// containers are left as they are: the agent's own and monitoring that
	// must see every card (the GPU Operator's DCGM exporter). A pod is
	// matched by its spec as the API has it, under the sandbox's UID: a
	// namespace alone, which a tenant might create, is not enough.
	// (the GPU Operator's, whose exporters see every card).
	Unrestricted []string
	// PodWait bounds how long a creation waits for its pod to reach the
	// pod cache; it is cut to half of what is left of the runtime's request
	// timeout, so the answer always arrives in time.
	PodWait time.Duration
	// RetryMax caps the wait between reconnection attempts (30 s if zero).
	RetryMax time.Duration
	// Claims reads a resource claim a container uses, as the API server has
	// it (within ctx); nil refuses every container that uses one and holds
	// no assignment.
	Claims func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)

	// Refused, when set, is told each refusal, at most once per container
	// and reason every refusalInterval (kubelet retries a refused
	// container with backoff); it must not block.
	Refused func(pod *v1.Pod, container, reason string)

	refusedMu sync.Mutex
	refusals  map[string]refusal // by pod UID and container

	pods  atomic.Pointer[PodGetter]
	cards atomic.Pointer[[]discovery.Card]
	// live are the shares held by the containers running now.
	live shares
	// dial replaces the unix-socket dialer in tests.
	dial func(socket string) (net.Conn, error)

	// Unenforced, when set, is told of every container found running
	// without enforcement when the plugin connects; it must not block.
	Unenforced func(Unenforced)
	// stop replaces stopContainer in tests.
	stop func(*api.Container) error

	auditMu sync.Mutex
	synced  *syncedState
	wake    chan struct{}

	mu        sync.Mutex
	escapes   map[string]struct{} // unstoppable containers that escaped enforcement
	connected bool
	lastErr   error
	since     time.Time
	changes   chan struct{}
}

// SetPods gives the plugin its pod cache, once synced. Until then every
// container fails to start.
func (p *Plugin) SetPods(pods PodGetter) {
	p.pods.Store(&pods)
	p.changed()
}

// Update tells the plugin the node's cards, after every scan: assignments
// and claims are checked against them.
func (p *Plugin) Update(cards []discovery.Card) {
	cards = slices.Clone(cards)
	if cards == nil {
		cards = []discovery.Card{}
	}
	if p.cards.Swap(&cards) == nil {
		p.changed()
	}
}

// node is what the plugin knows of its node now; claims are read within
// ctx.
func (p *Plugin) node(ctx context.Context) enforce.Node {
	n := enforce.Node{Name: p.Node}
	if p.Claims != nil {
		n.Claims = func(namespace, name string) (*resourceapi.ResourceClaim, error) {
			return p.Claims(ctx, namespace, name)
		}
	}
	if cards := p.cards.Load(); cards != nil {
		n.Cards = *cards
	}
	n.MIGCaps = p.MIGCaps
	return n
}

// NotReady says why the plugin cannot enforce assignments now, or "" when
// it can: it is connected to the runtime, its pod cache has synced and it
// knows the node's cards.
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
	case p.cards.Load() == nil:
		return reasonNoCards
	case len(p.escapes) > 0:
		return fmt.Sprintf("%d container(s) created while the agent could not enforce may see cards and could not be stopped", len(p.escapes))
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

// Synchronize is the runtime's first call after the plugin registered: it
// lists the pods and containers running now, whose shares of the cards the
// plugin counts from then on.
func (p *Plugin) Synchronize(_ context.Context, sandboxes []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	bySandbox := make(map[string]*api.PodSandbox, len(sandboxes))
	for _, sb := range sandboxes {
		bySandbox[sb.GetId()] = sb
	}
	live := map[string]runningContainer{}
	for _, ctr := range containers {
		sb := bySandbox[ctr.GetPodSandboxId()]
		owner := Owner{Namespace: sb.GetNamespace(), Pod: sb.GetName(), PodUID: types.UID(sb.GetUid()), Container: ctr.GetName()}
		live[ctr.GetId()] = runningContainer{owner: owner, holdings: runningHoldings(ctr)}
	}
	p.live.reset(live)
	p.remember(sandboxes, containers)
	p.setConnected(true, nil)
	return nil, nil
}

// StopContainer forgets the share of a container that stopped.
func (p *Plugin) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.live.release(ctr.GetId())
	p.escaped(ctr.GetId(), false)
	return nil, nil
}

// RemoveContainer forgets a removed container and removes its shared region.
func (p *Plugin) RemoveContainer(ctx context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.live.release(ctr.GetId())
	p.escaped(ctr.GetId(), false)
	if err := p.Enforce.Paths.RemoveRegion(enforce.RegionName(ctr.GetId())); err != nil {
		klog.FromContext(ctx).Error(err, "Removing a container's shared region", "container", ctr.GetId())
	}
	return nil
}

// CreateContainer applies the container's GPU assignment, or hides every
// card from a container that asks for none. A container that asks for GPUs
// without a valid assignment for this node and pod — or whose pod the agent
// does not know in time — fails to start, with the reason.
func (p *Plugin) CreateContainer(ctx context.Context, sandbox *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	pod, err := p.pod(ctx, sandbox.Namespace, sandbox.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("tessera: container %q of pod %s/%s: %w", ctr.Name, sandbox.Namespace, sandbox.Name, err)
	}
	if p.unrestricted(pod, sandbox) {
		p.live.admitUnrestricted(ctr.GetId(), ownerOf(pod, ctr))
		klog.FromContext(ctx).V(2).Info("Left container of an unrestricted service account alone", "pod", klog.KObj(pod), "container", ctr.Name, "serviceAccount", pod.Spec.ServiceAccountName)
		return nil, nil, nil
	}
	adj, err := p.adjust(ctx, pod, sandbox, ctr)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Refusing to start container", "pod", klog.KObj(pod), "container", ctr.Name)
		p.refused(pod, ctr.Name, err.Error())
		return nil, nil, fmt.Errorf("tessera: %w", err)
	}
	if len(adj.Env) == 0 {
		klog.FromContext(ctx).V(2).Info("Left container to its Tessera claims", "pod", klog.KObj(pod), "container", ctr.Name)
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

// refusalInterval is how often one refusal of a container is told again.
const refusalInterval = 5 * time.Minute

// refusal is the last refusal told of a container.
type refusal struct {
	reason string
	at     time.Time
}

// refused tells Refused of a refusal, unless it told the same one of the
// same container within refusalInterval.
func (p *Plugin) refused(pod *v1.Pod, container, reason string) {
	if p.Refused == nil {
		return
	}
	key := string(pod.UID) + "/" + container
	now := time.Now()
	p.refusedMu.Lock()
	last, told := p.refusals[key]
	if told && last.reason == reason && now.Sub(last.at) < refusalInterval {
		p.refusedMu.Unlock()
		return
	}
	if p.refusals == nil || len(p.refusals) > maxRefusals {
		p.refusals = map[string]refusal{} // forget old ones rather than grow
	}
	p.refusals[key] = refusal{reason: reason, at: now}
	p.refusedMu.Unlock()
	p.Refused(pod, container, reason)
}

// maxRefusals bounds the refusals remembered.
const maxRefusals = 4096

// Running lists the containers the runtime runs now, with the shares of
// cards each holds (over-use detection compares them with what they use).
func (p *Plugin) Running() []Running { return p.live.running() }

// Resized records that the container with runtime ID id now holds cards
// (its resized shares, on the same cards), for admission and over-use
// detection; false when it holds nothing.
func (p *Plugin) Resized(id string, cards []gpuinfo.CardAssignment) bool {
	return p.live.resize(enforce.ContainerKey(id), cards)
}

// ownerOf names ctr of pod.
func ownerOf(pod *v1.Pod, ctr *api.Container) Owner {
	return Owner{Namespace: pod.Namespace, Pod: pod.Name, PodUID: pod.UID, Container: ctr.GetName()}
}

// unrestricted reports whether pod, running in sandbox, runs as one of the
// unrestricted service accounts.
func (p *Plugin) unrestricted(pod *v1.Pod, sandbox *api.PodSandbox) bool {
	return pod.UID == types.UID(sandbox.GetUid()) && slices.Contains(p.Unrestricted, pod.Namespace+":"+pod.Spec.ServiceAccountName)
}

// adjust decides the container's adjustment, checks it against the
// container as the runtime built it and the shares held now, records its
// share and creates its shared region.
func (p *Plugin) adjust(ctx context.Context, pod *v1.Pod, sandbox *api.PodSandbox, ctr *api.Container) (*enforce.Adjustment, error) {
	node := p.node(ctx)
	adj, err := p.Enforce.For(pod, types.UID(sandbox.Uid), ctr.Name, ctr.Id, node)
	if err != nil {
		return nil, err // it names the pod
	}
	err = adj.CheckEnv(ctr.Env)
	if err == nil {
		err = enforce.CheckDevices(deviceNodes(ctr), adj.Holdings, node)
	}
	if err == nil {
		err = p.live.admit(ctr.Id, ownerOf(pod, ctr), adj.Holdings, node.Cards)
	}
	if err == nil && adj.Region != "" {
		if err = p.Enforce.Paths.CreateRegion(adj.Region); err != nil {
			p.live.release(ctr.Id)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s, container %q: %w", pod.Namespace, pod.Name, ctr.Name, err)
	}
	return adj, nil
}

// deviceNodes are the device nodes the runtime creates the container with.
func deviceNodes(ctr *api.Container) []enforce.DeviceNode {
	var out []enforce.DeviceNode
	for _, d := range ctr.GetLinux().GetDevices() {
		out = append(out, enforce.DeviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
	}
	return out
}

// Pod returns a pod bound to the node from the agent's pod cache, waiting
// for it as container creation does.
func (p *Plugin) Pod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	return p.pod(ctx, namespace, name)
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
// connects again, waiting longer after each failure up to RetryMax. Each
// time it connects, it audits the containers the runtime lists (see
// Unenforced) once its pod cache and cards allow.
func (p *Plugin) Run(ctx context.Context, socket string) {
	logger := klog.FromContext(ctx)
	retryMax := p.RetryMax
	if retryMax == 0 {
		retryMax = 30 * time.Second
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: retryMax}
	go p.auditLoop(ctx)
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

// podsOnNode is the field selector of the unfinished pods bound to node.
func podsOnNode(node string) string {
	return fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermNotEqualSelector("status.phase", string(v1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(v1.PodFailed)),
	).String()
}

// SlimPod cuts a pod to what the agent reads of it — its identity, its
// Tessera annotations, each container's name, resources and restart
// policy, its claims, node, priority and service account, and the status
// of its claims and containers — so that the cache of a node's pods stays
// small however large their specs (environments, probes, volumes). Other
// objects pass unchanged.
func SlimPod(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec: v1.PodSpec{
			NodeName: pod.Spec.NodeName, Priority: pod.Spec.Priority, ServiceAccountName: pod.Spec.ServiceAccountName,
			ResourceClaims: pod.Spec.ResourceClaims,
			InitContainers: slimContainers(pod.Spec.InitContainers), Containers: slimContainers(pod.Spec.Containers),
		},
		Status: v1.PodStatus{
			Phase: pod.Status.Phase, ResourceClaimStatuses: pod.Status.ResourceClaimStatuses,
			InitContainerStatuses: slimStatuses(pod.Status.InitContainerStatuses), ContainerStatuses: slimStatuses(pod.Status.ContainerStatuses),
			EphemeralContainerStatuses: slimStatuses(pod.Status.EphemeralContainerStatuses),
		},
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, gpuinfo.Domain+"/") || k == gpuinfo.HAMiModeAnnotation {
			if slim.Annotations == nil {
				slim.Annotations = map[string]string{}
			}
			slim.Annotations[k] = v
		}
	}
	return slim, nil
}

func slimContainers(in []v1.Container) []v1.Container {
	if in == nil {
		return nil
	}
	out := make([]v1.Container, len(in))
	for i, c := range in {
		out[i] = v1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

func slimStatuses(in []v1.ContainerStatus) []v1.ContainerStatus {
	if in == nil {
		return nil
	}
	out := make([]v1.ContainerStatus, len(in))
	for i, s := range in {
		out[i] = v1.ContainerStatus{Name: s.Name, ContainerID: s.ContainerID}
	}
	return out
}

// WatchPodsOnNode starts an informer over the pods bound to node — the only
// pods whose containers the runtime on that node creates — and returns a
// getter reading its cache once it has synced. It fails if the cache cannot
// sync before ctx ends (for example, when the agent may not list pods).
func WatchPodsOnNode(ctx context.Context, client kubernetes.Interface, node string) (PodGetter, error) {
	lister, err := PodsOnNode(ctx, client, node, nil)
	if err != nil {
		return nil, err
	}
	return func(namespace, name string) (*v1.Pod, error) { return lister.Pods(namespace).Get(name) }, nil
}

// PodsOnNode is WatchPodsOnNode's informer, as a lister of its cache: the
// node agent's one watch of its pods serves enforcement, metrics and the MIG
// slices. It holds the pods that have not finished (a pod leaves the watch
// when it succeeds or fails), each cut to what the agent reads (SlimPod).
// onChange, when set, is told each pod the watch delivers a change of (nil
// when a deletion was missed and the pod is not known).
func PodsOnNode(ctx context.Context, client kubernetes.Interface, node string, onChange func(*v1.Pod)) (corelisters.PodLister, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = podsOnNode(node)
	}), informers.WithTransform(SlimPod))
	informer := factory.Core().V1().Pods()
	if onChange != nil {
		changed := func(obj any) {
			pod, _ := obj.(*v1.Pod)
			onChange(pod)
		}
		if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) }, DeleteFunc: changed,
		}); err != nil {
			return nil, err
		}
	}
	lister := informer.Lister()
	factory.Start(ctx.Done())
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return nil, fmt.Errorf("the informer of %v on node %s did not sync: %w", typ, node, context.Cause(ctx))
		}
	}
	return lister, nil
}
