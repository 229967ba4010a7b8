// Package resize is the resize controller: it decides each GPUShareResize
// (tessera.io/v1alpha1) against the scheduler's ledger, records the new
// share in the pod's assignment annotation, and follows the node agent's
// report until the resize is applied or refused (docs/resize.md). It runs in
// the scheduler's process, beside the ledger its placements use, under a
// leader election of its own: the scheduling framework gives a plugin none.
package resize

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// LeaseName is the controller's leader-election Lease, in the namespace of
// the agents' Leases (Tessera's).
const LeaseName = "tessera-resize-controller"

// Leader election timings, kube-scheduler's defaults.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// DefaultAgentTimeout is how long a resize waits for the node agent's
// report before it is refused (a grow rolled back).
const DefaultAgentTimeout = 2 * time.Minute

// Config is what the controller works with.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Pod returns a pod from the scheduler's informer, or an error
	// satisfying apierrors.IsNotFound.
	Pod    func(namespace, name string) (*v1.Pod, error)
	Ledger *ledger.Ledger
	// Nominated reports whether a pod asking for GPUs is nominated to the
	// node (a preemption under way: its room must not be grown into).
	Nominated func(node string) bool
	// Names are the resource names pods ask GPUs by.
	Names    gpuinfo.ResourceNames
	Recorder events.EventRecorder
	// LeaseNamespace is where the leader-election Lease is.
	LeaseNamespace string
	// AgentTimeout bounds the wait for the node agent's report.
	AgentTimeout time.Duration
}

// Controller decides GPUShareResizes.
type Controller struct {
	Config
	resizes dynamic.NamespaceableResourceInterface
	logger  klog.Logger
	now     func() time.Time
	// informer and queue are those of the current term as leader.
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	// takenUp holds, by containerKey, the resize taken up last (its name).
	takenUp sync.Map
	// rs is automatic right-sizing's state (rightsize.go).
	rs rightSizing
}

// New returns a controller; Run starts it.
func New(ctx context.Context, cfg Config) *Controller {
	if cfg.AgentTimeout <= 0 {
		cfg.AgentTimeout = DefaultAgentTimeout
	}
	registerMetrics.Do(func() { legacyregistry.MustRegister(rightSizeDecisions) })
	return &Controller{
		Config:  cfg,
		resizes: cfg.Dynamic.Resource(v1alpha1.Resource),
		logger:  klog.FromContext(ctx).WithName("resize"),
		now:     time.Now,
	}
}

// Run campaigns for the controller's Lease until ctx ends, and decides
// resizes while it leads.
func (c *Controller) Run(ctx context.Context) {
	host, _ := os.Hostname()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: c.LeaseNamespace},
		Client:     c.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID())},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   leaseDuration,
			RenewDeadline:   renewDeadline,
			RetryPeriod:     retryPeriod,
			ReleaseOnCancel: true,
			Name:            LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() { c.logger.Info("Resize controller stopped leading") },
			},
		})
	}
}

// lead decides resizes until ctx ends (leadership lost), with an informer
// and a queue of the term's own.
func (c *Controller) lead(ctx context.Context) {
	c.logger.Info("Resize controller leading")
	c.informer = dynamicinformer.NewDynamicSharedInformerFactory(c.Dynamic, 0).ForResource(v1alpha1.Resource).Informer()
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpushareresize"})
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if err := c.informer.AddIndexers(cache.Indexers{podIndex: indexByPod}); err != nil {
		c.logger.Error(err, "Indexing GPUShareResizes")
		return
	}
	if _, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		c.logger.Error(err, "Watching GPUShareResizes")
		return
	}
	go c.informer.RunWithContext(ctx)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return
	}
	go c.rightSize(ctx)
	for c.next(ctx) {
	}
}

// next decides the next resize in the queue; false once the queue is shut
// down.
func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	after, err := c.sync(ctx, key)
	switch {
	case err != nil:
		c.logger.Error(err, "Resize not decided; retrying", "resize", key)
		c.queue.AddRateLimited(key)
	case after > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, after)
	default:
		c.queue.Forget(key)
	}
	return true
}

// event records an Event on the pod for the resize's owner.
func (c *Controller) event(pod *v1.Pod, eventType, reason, format string, args ...any) {
	if c.Recorder != nil && pod != nil {
		c.Recorder.Eventf(pod, nil, eventType, reason, "Resize", "%s", fmt.Sprintf(format, args...))
	}
}
