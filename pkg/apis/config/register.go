package config

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// SchemeGroupVersion is the internal version of kube-scheduler's config group.
var SchemeGroupVersion = schedconfig.SchemeGroupVersion

// AddToScheme registers the internal types; it is also added to kube-scheduler's
// own scheme builder so its plugin-argument conversion knows them.
var AddToScheme = schedconfig.SchemeBuilder.AddToScheme

func init() {
	schedconfig.SchemeBuilder.Register(addKnownTypes)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &GPUShareArgs{})
	return nil
}

// DeepCopyObject implements runtime.Object.
func (in *GPUShareArgs) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	return &out
}
