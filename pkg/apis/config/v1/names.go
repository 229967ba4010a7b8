package v1

import (
	"encoding/json"
	"fmt"

	schedv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// pluginName is GPUShare's name in a scheduler configuration.
const pluginName = "GPUShare"

// ResourceNamesIn returns the resource names, defaulted, that GPUShare is
// configured with in a KubeSchedulerConfiguration file, so that the node
// agent reads pods with exactly the scheduler's names. Every profile must
// use the same names: the cluster has one set of GPU resources.
func ResourceNamesIn(raw []byte) (gpuinfo.ResourceNames, error) {
	var cfg schedv1.KubeSchedulerConfiguration
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return gpuinfo.ResourceNames{}, fmt.Errorf("scheduler configuration: %w", err)
	}
	var names *config.ResourceNames
	for i, profile := range cfg.Profiles {
		args := &GPUShareArgs{}
		for _, pc := range profile.PluginConfig {
			if pc.Name == pluginName && pc.Args.Raw != nil {
				if err := json.Unmarshal(pc.Args.Raw, args); err != nil {
					return gpuinfo.ResourceNames{}, fmt.Errorf("scheduler configuration: profiles[%d].pluginConfig[%s].args: %w", i, pluginName, err)
				}
			}
		}
		SetDefaults_GPUShareArgs(args)
		got := config.ResourceNames(*args.ResourceNames)
		if names != nil && got != *names {
			return gpuinfo.ResourceNames{}, fmt.Errorf("scheduler configuration: profile %q uses resource names %+v, another profile %+v; all profiles must use one set", ptr.Deref(profile.SchedulerName, ""), got, *names)
		}
		names = &got
	}
	if names == nil {
		return gpuinfo.DefaultResourceNames(), nil
	}
	return names.Contract(), nil
}
