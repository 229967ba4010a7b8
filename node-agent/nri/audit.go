package nri

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
)

// Unenforced is a container found running without the adjustment the agent
// gives it: created while the plugin was not connected (an agent restart, a
// request that timed out), when the runtime goes on without it.
type Unenforced struct {
	// Pod is the container's pod as the API has it; nil when the API has
	// none under the sandbox's name and UID.
	Pod *v1.Pod
	// Namespace, PodName and Container name the container as the runtime
	// does.
	Namespace, PodName, Container string
	// Reason says how it differs from what the agent would have made it.
	Reason string
	// HoldsGPU says whether it may see a card: by its environment
	// (NVIDIA_VISIBLE_DEVICES) or its device nodes.
	HoldsGPU bool
	// Stopped says whether the agent stopped it (only one that holds a GPU
	// is stopped); StopErr is why it could not.
	Stopped bool
	StopErr error
}

// syncedState is what the runtime listed when the plugin last connected,
// kept until the plugin can audit it (its pod cache synced, its cards
// known).
type syncedState struct {
	sandboxes  map[string]*api.PodSandbox
	containers []*api.Container
}

// auditRetry is how often an audit waiting for the pod cache and the cards
// looks again.
const auditRetry = time.Second

// remember keeps the runtime's list for the audit and wakes it.
func (p *Plugin) remember(sandboxes []*api.PodSandbox, containers []*api.Container) {
	s := &syncedState{sandboxes: make(map[string]*api.PodSandbox, len(sandboxes)), containers: containers}
	for _, sb := range sandboxes {
		s.sandboxes[sb.GetId()] = sb
	}
	p.auditMu.Lock()
	p.synced = s
	p.auditMu.Unlock()
	select {
	case p.auditWake() <- struct{}{}:
	default:
	}
}

func (p *Plugin) auditWake() chan struct{} {
	p.auditMu.Lock()
	defer p.auditMu.Unlock()
	if p.wake == nil {
		p.wake = make(chan struct{}, 1)
	}
	return p.wake
}

// auditLoop audits each list the runtime gives on connecting, as soon as
// the pod cache and the cards allow, until ctx ends.
func (p *Plugin) auditLoop(ctx context.Context) {
	wake := p.auditWake()
	retry := time.NewTicker(auditRetry)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-retry.C:
		}
		p.auditMu.Lock()
		s := p.synced
		p.auditMu.Unlock()
		if s == nil || p.pods.Load() == nil || p.cards.Load() == nil {
			continue
		}
		p.auditMu.Lock()
		if p.synced == s {
			p.synced = nil
		}
		p.auditMu.Unlock()
		for _, u := range p.audit(ctx, s) {
			klog.FromContext(ctx).Info("Container found running without GPU enforcement", "namespace", u.Namespace, "pod", u.PodName, "container", u.Container,
				"reason", u.Reason, "holdsGPU", u.HoldsGPU, "stopped", u.Stopped, "stopError", u.StopErr)
			if p.Unenforced != nil {
				p.Unenforced(u)
			}
		}
	}
}

// audit checks every container of the runtime's list against what the
// agent would have given it, and stops those that escaped enforcement and
// may see a card. A container it cannot stop keeps the plugin not ready
// until the runtime says it has stopped.
func (p *Plugin) audit(ctx context.Context, s *syncedState) []Unenforced {
	getter := *p.pods.Load()
	node := p.node(ctx)
	var found []Unenforced
	for _, ctr := range s.containers {
		sb := s.sandboxes[ctr.GetPodSandboxId()]
		if sb == nil {
			continue
		}
		u := Unenforced{Namespace: sb.GetNamespace(), PodName: sb.GetName(), Container: ctr.GetName()}
		pod, err := getter(sb.GetNamespace(), sb.GetName())
		switch {
		case apierrors.IsNotFound(err) || (err == nil && pod.UID != types.UID(sb.GetUid())):
			u.Reason = "its pod is not in the API under the sandbox's UID"
		case err != nil:
			continue // judged at the next connection
		case p.unrestricted(pod, sb):
			continue
		default:
			u.Pod = pod
			u.Reason = p.differs(pod, sb, ctr, node)
		}
		if u.Reason == "" {
			continue
		}
		u.HoldsGPU = seesGPU(ctr)
		if u.HoldsGPU {
			stop := p.stop
			if stop == nil {
				stop = stopContainer
			}
			if u.StopErr = stop(ctr); u.StopErr == nil {
				u.Stopped = true
			} else {
				p.escaped(ctr.GetId(), true)
			}
		}
		found = append(found, u)
	}
	return found
}

// differs says how the running container differs from what the agent
// would have made it, or "" when it runs as enforcement has it: the cards
// it sees, its limits, the library loaded, its device nodes. What earlier
// agents did otherwise (the region's path, other mounts) is not compared,
// so an upgrade stops no container.
func (p *Plugin) differs(pod *v1.Pod, sb *api.PodSandbox, ctr *api.Container, node enforce.Node) string {
	want, err := p.Enforce.For(pod, types.UID(sb.GetUid()), ctr.GetName(), ctr.GetId(), node)
	if err != nil {
		return "the agent would have refused it: " + err.Error()
	}
	env := map[string]string{}
	for _, kv := range ctr.GetEnv() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for _, e := range want.Env {
		if !audited(e.Name) {
			continue
		}
		if got, ok := env[e.Name]; !ok || got != e.Value {
			return fmt.Sprintf("it runs with %s=%q, not %q", e.Name, got, e.Value)
		}
	}
	mounts := map[string]bool{}
	for _, m := range ctr.GetMounts() {
		mounts[m.GetDestination()] = true
	}
	for _, m := range want.Mounts {
		if m.ReadOnly && !mounts[m.Destination] { // the library and its preload file
			return "it runs without the interception library (" + m.Destination + ")"
		}
	}
	if err := enforce.CheckDevices(deviceNodes(ctr), want.Holdings, node); err != nil {
		return err.Error()
	}
	return ""
}

// audited reports whether the audit compares the variable: the cards a
// container sees and its limits.
func audited(name string) bool {
	return name == "NVIDIA_VISIBLE_DEVICES" || strings.HasPrefix(name, "CUDA_DEVICE_MEMORY_LIMIT_") || strings.HasPrefix(name, "CUDA_DEVICE_SM_LIMIT_")
}

// seesGPU reports whether a container may see a card: NVIDIA's container
// toolkit would give it the cards NVIDIA_VISIBLE_DEVICES names (where it
// honours the variable), or it has a GPU device node.
func seesGPU(ctr *api.Container) bool {
	visible := ""
	for _, kv := range ctr.GetEnv() {
		if v, ok := strings.CutPrefix(kv, "NVIDIA_VISIBLE_DEVICES="); ok {
			visible = v
		}
	}
	if visible != "" && visible != "void" && visible != "none" {
		return true
	}
	return enforce.CheckDevices(deviceNodes(ctr), nil, enforce.Node{}) != nil
}

// stopContainer kills the container's init process, and with it the
// container (its PID namespace ends), once the process's cgroup shows it is
// still the container's.
func stopContainer(ctr *api.Container) error {
	return discovery.KillContainerProcess("/proc", ctr.GetPid(), ctr.GetId())
}

// escaped records (or, with still false, forgets) a container that escaped
// enforcement and could not be stopped: while any remains, the plugin is
// not ready, and the scheduler places no GPU pod on the node.
func (p *Plugin) escaped(id string, still bool) {
	p.mu.Lock()
	_, was := p.escapes[id]
	switch {
	case still && !was:
		if p.escapes == nil {
			p.escapes = map[string]struct{}{}
		}
		p.escapes[id] = struct{}{}
	case !still && was:
		delete(p.escapes, id)
	default:
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.changed()
}
