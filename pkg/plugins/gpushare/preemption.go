package gpushare

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	kubeschedulerv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// PreemptionName is the preemption plugin's name in the scheduler
// configuration; it takes DefaultPreemption's place in Tessera's profiles.
const PreemptionName = "GPUSharePreemption"

var (
	_ fwk.PostFilterPlugin         = &Preemption{}
	_ fwk.PodGroupPostFilterPlugin = &Preemption{}
	_ fwk.PreEnqueuePlugin         = &Preemption{}
	_ fwk.EnqueueExtensions        = &Preemption{}
)

// Preemption is kube-scheduler's DefaultPreemption, choosing and evicting
// the same victims, that also records for which preemptor it evicts each
// (victimBook): GPUShare then places a nominated pod on the cards of its own
// victims only, and holds it to its node for those alone. Without it (a
// profile keeping DefaultPreemption), every victim on a node counts for every
// preemptor of higher priority there, and two preemptors nominated to one
// node can each count on the other's cards.
type Preemption struct {
	*defaultpreemption.DefaultPreemption
}

// Name returns the plugin's name.
func (*Preemption) Name() string { return PreemptionName }

// NewPreemption builds the plugin from DefaultPreemptionArgs (defaulted
// when none are given), with the feature gates kube-scheduler's own
// plugins are built with.
func NewPreemption(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := preemptionArgs(obj)
	if err != nil {
		return nil, err
	}
	dp, err := defaultpreemption.New(ctx, args, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", PreemptionName, err)
	}
	book := victimBookFor(ctx, h.SharedInformerFactory())
	evict := dp.Executor.PreemptPod
	dp.Executor.PreemptPod = func(ctx context.Context, c preemption.Candidate, preemptor preemption.ExecutorPreemptor, victim *v1.Pod, pluginName string) (bool, error) {
		// Recorded before the eviction is written, so that no informer
		// event shows the victim terminating without it.
		uids := preemptorUIDs(preemptor)
		book.record(victim, uids)
		inMemory, err := evict(ctx, c, preemptor, victim, pluginName)
		if inMemory || err != nil {
			book.forget(victim.UID, uids)
		}
		return inMemory, err
	}
	return &Preemption{dp}, nil
}

// preemptionArgs returns DefaultPreemption's internal args, defaulted as
// kube-scheduler defaults them. kube-scheduler decodes the args of a
// plugin by its name (GPUSharePreemptionArgs, a kind it does not know), so
// a profile's args arrive undecoded: they are decoded, strictly, as
// DefaultPreemptionArgs.
func preemptionArgs(obj runtime.Object) (*schedconfig.DefaultPreemptionArgs, error) {
	switch a := obj.(type) {
	case *schedconfig.DefaultPreemptionArgs:
		return a, nil
	case nil:
		return preemptionArgs(&runtime.Unknown{Raw: []byte("{}")})
	case *runtime.Unknown:
		gvk := kubeschedulerv1.SchemeGroupVersion.WithKind("DefaultPreemptionArgs")
		decoded, _, err := schedscheme.Codecs.UniversalDecoder().Decode(a.Raw, &gvk, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: decoding args as DefaultPreemptionArgs: %w", PreemptionName, err)
		}
		out, ok := decoded.(*schedconfig.DefaultPreemptionArgs)
		if !ok {
			return nil, fmt.Errorf("%s: want args of type DefaultPreemptionArgs, got %T", PreemptionName, decoded)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%s: want args of type DefaultPreemptionArgs, got %T", PreemptionName, obj)
	}
}

// preemptorUIDs are the pods a preemption is for: one pod, or a pod
// group's members.
func preemptorUIDs(preemptor preemption.ExecutorPreemptor) []types.UID {
	pods := preemptor.Pods()
	uids := make([]types.UID, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, p.UID)
	}
	return uids
}
