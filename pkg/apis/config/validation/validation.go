// Package validation checks Tessera's plugin arguments.
package validation

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

var policies = []string{string(config.PolicyBinpack), string(config.PolicySpread), string(config.PolicyFragmentationAware)}

// ValidateGPUShareArgs returns every problem of the args, with field paths
// under path.
func ValidateGPUShareArgs(path *field.Path, args *config.GPUShareArgs) error {
	var errs field.ErrorList
	for _, p := range []struct {
		name  string
		value config.Policy
	}{{"nodePolicy", args.NodePolicy}, {"gpuPolicy", args.GPUPolicy}} {
		if !slices.Contains(policies, string(p.value)) {
			errs = append(errs, field.NotSupported(path.Child(p.name), p.value, policies))
		}
	}
	errs = append(errs, ValidateResourceNames(path.Child("resourceNames"), args.ResourceNames)...)
	if args.AgentHeartbeatTimeout.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("agentHeartbeatTimeout"), args.AgentHeartbeatTimeout.Duration.String(), "must not be negative (0s disables the check)"))
	}
	for _, msg := range utilvalidation.IsDNS1123Label(args.AgentNamespace) {
		errs = append(errs, field.Invalid(path.Child("agentNamespace"), args.AgentNamespace, msg))
	}
	return errs.ToAggregate()
}

// ValidateResourceNames returns every problem of the resource names pods ask
// for GPUs with, with field paths under path: each is required, a
// domain-prefixed extended resource name, and distinct from the others.
func ValidateResourceNames(path *field.Path, names config.ResourceNames) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]string{}
	for _, n := range []struct {
		field, value string
	}{
		{"gpu", names.GPU},
		{"memory", names.Memory},
		{"memoryPercent", names.MemoryPercent},
		{"cores", names.Cores},
	} {
		p := path.Child(n.field)
		switch {
		case n.value == "":
			errs = append(errs, field.Required(p, "a resource name"))
		case !v1helper.IsExtendedResourceName(v1.ResourceName(n.value)):
			errs = append(errs, field.Invalid(p, n.value, "must be a domain-prefixed extended resource name, e.g. tessera.io/gpu"))
		case seen[n.value] != "":
			errs = append(errs, field.Duplicate(p, n.value))
		}
		seen[n.value] = n.field
	}
	return errs
}
