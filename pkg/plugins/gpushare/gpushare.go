// Package gpushare is Tessera's scheduler-framework plugin: it places pods
// that ask for GPU shares on a node and on specific cards of that node, keeps
// the per-card ledger, and binds each pod together with its card assignment.
package gpushare

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
	"github.com/tessera-gpu/tessera/pkg/apis/config/validation"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Name is the plugin's name in the scheduler configuration.
const Name = "GPUShare"

var (
	_ fwk.PreFilterPlugin     = &Plugin{}
	_ fwk.PreFilterExtensions = &Plugin{}
	_ fwk.FilterPlugin        = &Plugin{}
	_ fwk.PreScorePlugin      = &Plugin{}
	_ fwk.ScorePlugin         = &Plugin{}
	_ fwk.ScoreExtensions     = &Plugin{}
	_ fwk.ReservePlugin       = &Plugin{}
	_ fwk.BindPlugin          = &Plugin{}
	_ fwk.EnqueueExtensions   = &Plugin{}
	_ fwk.SignPlugin          = &Plugin{}
)

// policies maps configured policy names to the allocator's.
var policies = map[config.Policy]allocator.Policy{
	config.PolicyBinpack:            allocator.Binpack,
	config.PolicySpread:             allocator.Spread,
	config.PolicyFragmentationAware: allocator.FragmentationAware,
}

// Plugin is the GPUShare plugin. One instance serves one scheduler profile.
type Plugin struct {
	handle fwk.Handle
	client kubernetes.Interface
	*feed
	names      gpuinfo.ResourceNames
	nodePolicy allocator.Policy
	gpuPolicy  allocator.Policy
	// agentTimeout is how long an agent may be silent; 0 disables the check.
	agentTimeout time.Duration
	// fitView keeps the per-card resources from NodeResourcesFit's Filter.
	fitView *fitView
}

// Name returns the plugin's name.
func (p *Plugin) Name() string { return Name }

// HoldsCards reports whether the plugin's ledger still records cards for the
// pod. The ledger learns of deletions on its own informer handler, after the
// scheduler's cache may have: a replay that must see a departure everywhere
// before it goes on waits for this to turn false.
func (p *Plugin) HoldsCards(uid types.UID) bool { return p.ledger.Holds(uid) }

// New builds the plugin from its (internal, defaulted) args. Args that fail
// validation stop the scheduler from starting, with field paths in the error.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := argsFrom(obj)
	if err != nil {
		return nil, err
	}
	if err := validation.ValidateGPUShareArgs(field.NewPath("pluginConfig").Key(Name).Child("args"), args); err != nil {
		return nil, fmt.Errorf("invalid %s args: %w", Name, err)
	}
	p := &Plugin{
		handle:       h,
		client:       h.ClientSet(),
		nodePolicy:   policies[args.NodePolicy],
		gpuPolicy:    policies[args.GPUPolicy],
		agentTimeout: args.AgentHeartbeatTimeout.Duration,
		names:        args.ResourceNames.Contract(),
	}
	if p.fitView, err = newFitView(ctx, h, p.names); err != nil {
		return nil, err
	}
	p.feed, err = feedFor(ctx, h, args.AgentNamespace, p.names)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// argsFrom returns the plugin's internal args, defaulting when none were given.
func argsFrom(obj runtime.Object) (*config.GPUShareArgs, error) {
	switch a := obj.(type) {
	case *config.GPUShareArgs:
		return a, nil
	case nil:
		v := &configv1.GPUShareArgs{}
		configv1.SetDefaults_GPUShareArgs(v)
		out := &config.GPUShareArgs{}
		return out, configv1.Convert_v1_GPUShareArgs_To_config_GPUShareArgs(v, out)
	default:
		return nil, fmt.Errorf("%s: want args of type GPUShareArgs, got %T", Name, obj)
	}
}
