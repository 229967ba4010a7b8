package v1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	schedv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Defaults of GPUShareArgs.
const (
	DefaultAgentHeartbeatTimeout = 40 * time.Second
	DefaultAgentNamespace        = "tessera-system"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1.
var SchemeGroupVersion = schedv1.SchemeGroupVersion

// AddToScheme registers the versioned types, defaults and conversions; they
// are also added to kube-scheduler's v1 scheme builder.
var AddToScheme = schedv1.SchemeBuilder.AddToScheme

func init() {
	schedv1.SchemeBuilder.Register(addKnownTypes, addDefaultingFuncs, addConversionFuncs)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &GPUShareArgs{})
	return nil
}

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	scheme.AddTypeDefaultingFunc(&GPUShareArgs{}, func(obj any) { SetDefaults_GPUShareArgs(obj.(*GPUShareArgs)) })
	return nil
}

// SetDefaults_GPUShareArgs fills unset fields with their defaults.
func SetDefaults_GPUShareArgs(obj *GPUShareArgs) { //nolint:revive // the name follows the defaulter-gen convention
	if obj.NodePolicy == nil {
		p := string(config.PolicyBinpack)
		obj.NodePolicy = &p
	}
	if obj.GPUPolicy == nil {
		p := string(config.PolicyBinpack)
		obj.GPUPolicy = &p
	}
	if obj.AgentHeartbeatTimeout == nil {
		obj.AgentHeartbeatTimeout = &metav1.Duration{Duration: DefaultAgentHeartbeatTimeout}
	}
	if obj.AgentNamespace == nil {
		ns := DefaultAgentNamespace
		obj.AgentNamespace = &ns
	}
	if obj.ResourceNames == nil {
		obj.ResourceNames = &ResourceNames{}
	}
	def := gpuinfo.DefaultResourceNames()
	for _, f := range []struct {
		dst *string
		def string
	}{
		{&obj.ResourceNames.GPU, string(def.GPU)},
		{&obj.ResourceNames.Memory, string(def.Memory)},
		{&obj.ResourceNames.MemoryPercent, string(def.MemoryPercent)},
		{&obj.ResourceNames.Cores, string(def.Cores)},
	} {
		if *f.dst == "" {
			*f.dst = f.def
		}
	}
}

func addConversionFuncs(scheme *runtime.Scheme) error {
	if err := scheme.AddConversionFunc((*GPUShareArgs)(nil), (*config.GPUShareArgs)(nil), func(a, b any, _ conversion.Scope) error {
		return Convert_v1_GPUShareArgs_To_config_GPUShareArgs(a.(*GPUShareArgs), b.(*config.GPUShareArgs))
	}); err != nil {
		return err
	}
	return scheme.AddConversionFunc((*config.GPUShareArgs)(nil), (*GPUShareArgs)(nil), func(a, b any, _ conversion.Scope) error {
		return Convert_config_GPUShareArgs_To_v1_GPUShareArgs(a.(*config.GPUShareArgs), b.(*GPUShareArgs))
	})
}

// Convert_v1_GPUShareArgs_To_config_GPUShareArgs converts defaulted versioned
// args to the internal type.
func Convert_v1_GPUShareArgs_To_config_GPUShareArgs(in *GPUShareArgs, out *config.GPUShareArgs) error { //nolint:revive
	if in.NodePolicy != nil {
		out.NodePolicy = config.Policy(*in.NodePolicy)
	}
	if in.GPUPolicy != nil {
		out.GPUPolicy = config.Policy(*in.GPUPolicy)
	}
	if in.ResourceNames != nil {
		out.ResourceNames = config.ResourceNames(*in.ResourceNames)
	}
	if in.AgentHeartbeatTimeout != nil {
		out.AgentHeartbeatTimeout = *in.AgentHeartbeatTimeout
	}
	if in.AgentNamespace != nil {
		out.AgentNamespace = *in.AgentNamespace
	}
	return nil
}

// Convert_config_GPUShareArgs_To_v1_GPUShareArgs converts internal args to
// the versioned type.
func Convert_config_GPUShareArgs_To_v1_GPUShareArgs(in *config.GPUShareArgs, out *GPUShareArgs) error { //nolint:revive
	nodePolicy, gpuPolicy := string(in.NodePolicy), string(in.GPUPolicy)
	names := ResourceNames(in.ResourceNames)
	timeout, namespace := in.AgentHeartbeatTimeout, in.AgentNamespace
	out.NodePolicy, out.GPUPolicy, out.ResourceNames = &nodePolicy, &gpuPolicy, &names
	out.AgentHeartbeatTimeout, out.AgentNamespace = &timeout, &namespace
	return nil
}

// DeepCopyObject implements runtime.Object.
func (in *GPUShareArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	if in.NodePolicy != nil {
		p := *in.NodePolicy
		out.NodePolicy = &p
	}
	if in.GPUPolicy != nil {
		p := *in.GPUPolicy
		out.GPUPolicy = &p
	}
	if in.ResourceNames != nil {
		n := *in.ResourceNames
		out.ResourceNames = &n
	}
	if in.AgentHeartbeatTimeout != nil {
		d := *in.AgentHeartbeatTimeout
		out.AgentHeartbeatTimeout = &d
	}
	if in.AgentNamespace != nil {
		ns := *in.AgentNamespace
		out.AgentNamespace = &ns
	}
	return &out
}
