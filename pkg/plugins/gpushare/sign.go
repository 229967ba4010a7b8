package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// signKey names the plugin's fragment of a pod's scheduling signature.
const signKey = "tessera.io/GPUShare.PodRequest()"

// SignPod lets the scheduler batch pods with identical GPU requests and
// selectors: they get identical Filter and Score results from the same state.
func (p *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	req, err := gpuinfo.ParsePodRequest(pod, p.names)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	return []fwk.SignFragment{{Key: signKey, Value: req}}, nil
}
