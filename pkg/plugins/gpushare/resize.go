package gpushare

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/resize"
)

// startResizes starts the resize controller on the feed's ledger when the
// GPUShareResize CRD is installed (once per scheduler process: the feed is
// shared by every profile); it runs, under its own leader election, until
// ctx ends, and reads the agents' use reports from their Leases for
// automatic right-sizing.
func (f *feed) startResizes(ctx context.Context, h fwk.Handle, leases cache.SharedIndexInformer) error {
	cfg := h.KubeConfig()
	if cfg == nil {
		return nil
	}
	if ok, err := served(cfg, v1alpha1.Resource); err != nil || !ok {
		if err == nil {
			f.logger.Info("GPUShareResize CRD not installed: running shares are not resized (install manifests/ and restart to resize them)")
		}
		return err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c := resize.New(ctx, resize.Config{
		Client:         h.ClientSet(),
		Dynamic:        client,
		Pod:            f.pod,
		Ledger:         f.ledger,
		Nominated:      func(node string) bool { return f.gpuPodNominated(h, node) },
		Names:          f.names,
		Recorder:       f.recorder,
		LeaseNamespace: f.agentNamespace,
	})
	if _, err := leases.AddEventHandler(c.LeaseHandler()); err != nil {
		return fmt.Errorf("following the agents' use reports: %w", err)
	}
	go c.Run(ctx)
	return nil
}

// pod returns a pod from the scheduler's informer by namespace and name.
func (f *feed) pod(namespace, name string) (*v1.Pod, error) {
	obj, exists, err := f.pods.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, apierrors.NewNotFound(v1.Resource("pods"), name)
	}
	return obj.(*v1.Pod), nil
}

// gpuPodNominated reports whether a pod asking for GPUs is nominated to
// the node.
func (f *feed) gpuPodNominated(h fwk.Handle, node string) bool {
	return slices.ContainsFunc(h.NominatedPodsForNode(node), func(pi fwk.PodInfo) bool {
		req, err := gpuinfo.ParsePodRequest(pi.GetPod(), f.names)
		return err != nil || req != nil
	})
}
