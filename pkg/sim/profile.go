package sim

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"

	"github.com/tessera-gpu/tessera/manifests"
	tesseraconfig "github.com/tessera-gpu/tessera/pkg/apis/config"

	// Registers GPUShareArgs in kube-scheduler's configuration scheme.
	_ "github.com/tessera-gpu/tessera/pkg/apis/config/scheme"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// binpackProfile is the shipped profile RandomProfile is made from.
const binpackProfile = "tessera-binpack"

// LoadProfile decodes the shipped scheduler configuration, defaulted and
// validated as kube-scheduler does, and keeps the named profile only
// (RandomProfile is made from the binpack profile). The
// agent heartbeat check is turned off: simulated nodes have no agents.
// GPUShare's Filter runs first, so that a node whose cards cannot hold the
// pod is rejected before kube-scheduler's own filters run on it: what the
// plugin's PreFilter pruning does in a cluster, which a replay does without
// (orderedGPUShare). The nodes a pod passes are the same in any order.
func LoadProfile(name string) (*schedconfig.KubeSchedulerConfiguration, error) {
	cfg, err := shippedConfig()
	if err != nil {
		return nil, err
	}
	names := profileNames(cfg)
	for _, p := range cfg.Profiles {
		if name == RandomProfile && p.SchedulerName == binpackProfile {
			p = randomProfile(p)
		}
		if p.SchedulerName != name {
			continue
		}
		for _, pc := range p.PluginConfig {
			if args, ok := pc.Args.(*tesseraconfig.GPUShareArgs); ok && pc.Name == gpushare.Name {
				args.AgentHeartbeatTimeout = metav1.Duration{}
			}
		}
		p.Plugins.Filter.Enabled = append([]schedconfig.Plugin{{Name: gpushare.Name}}, p.Plugins.Filter.Enabled...)
		cfg.Profiles = []schedconfig.KubeSchedulerProfile{p}
		return cfg, nil
	}
	return nil, fmt.Errorf("no profile %q in the shipped scheduler configuration (have %v, and %q for replays)", name, names, RandomProfile)
}

// Profiles lists the shipped scheduler profiles.
func Profiles() ([]string, error) {
	cfg, err := shippedConfig()
	if err != nil {
		return nil, err
	}
	return profileNames(cfg), nil
}

// shippedConfig decodes manifests/base/scheduler/scheduler-config.yaml, defaulted and validated
// as kube-scheduler does.
func shippedConfig() (*schedconfig.KubeSchedulerConfiguration, error) {
	obj, _, err := schedscheme.Codecs.UniversalDecoder().Decode(manifests.SchedulerConfig, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding the shipped scheduler configuration: %w", err)
	}
	cfg, ok := obj.(*schedconfig.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("the shipped scheduler configuration is a %T", obj)
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("the shipped scheduler configuration: %w", err)
	}
	return cfg, nil
}
