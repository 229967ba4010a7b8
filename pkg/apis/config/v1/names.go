package v1

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	schedv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/apis/config/validation"
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

// resourceNameKeys are the keys of FormatResourceNames' text, as GPUShare's
// resourceNames arguments name them.
var resourceNameKeys = []string{"gpu", "memory", "memoryPercent", "cores"}

// FormatResourceNames writes names as the node agent's --resource-names
// flag takes them: "gpu=…,memory=…,memoryPercent=…,cores=…".
func FormatResourceNames(names gpuinfo.ResourceNames) string {
	values := []v1.ResourceName{names.GPU, names.Memory, names.MemoryPercent, names.Cores}
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = resourceNameKeys[i] + "=" + string(v)
	}
	return strings.Join(parts, ",")
}

// ParseResourceNames reads FormatResourceNames' text: every key once, each
// name valid and distinct, as GPUShare's arguments require. Empty text is
// Tessera's own names.
func ParseResourceNames(text string) (gpuinfo.ResourceNames, error) {
	if text == "" {
		return gpuinfo.DefaultResourceNames(), nil
	}
	values := map[string]string{}
	for _, part := range strings.Split(text, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || !slices.Contains(resourceNameKeys, key) {
			return gpuinfo.ResourceNames{}, fmt.Errorf("resource names %q: %q is not KEY=NAME with KEY one of %s", text, part, strings.Join(resourceNameKeys, ", "))
		}
		if _, dup := values[key]; dup {
			return gpuinfo.ResourceNames{}, fmt.Errorf("resource names %q: %s given twice", text, key)
		}
		values[key] = value
	}
	names := config.ResourceNames{GPU: values["gpu"], Memory: values["memory"], MemoryPercent: values["memoryPercent"], Cores: values["cores"]}
	if errs := validation.ValidateResourceNames(field.NewPath("resourceNames"), names); len(errs) > 0 {
		return gpuinfo.ResourceNames{}, fmt.Errorf("resource names %q: %w", text, errs.ToAggregate())
	}
	return names.Contract(), nil
}
