package gpushare

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/apis/reservation/v1alpha1"
)

// reservationsWaitKey files the pods kept out by a reservation among the
// waiting pods (heartbeats.wait); it cannot be a node name.
const reservationsWaitKey = "\x00reservations"

// reservations follows the GPUReservation objects: whole cards kept entirely
// free on selected nodes for the pods they name. Every other pod sees those
// cards as taken (allocator.Strategy.Reserve); pods kept out that way are
// retried as soon as a reservation changes.
type reservations struct {
	current atomic.Pointer[[]*reservation]
}

// reservation is one GPUReservation, parsed.
type reservation struct {
	name     string
	selector labels.Selector
	cards    int
	admitted v1alpha1.ReservedFor
	// reason is the Pending message of a pod it keeps out.
	reason string
}

// admits reports whether pod may use the reserved cards.
func (r *reservation) admits(pod *v1.Pod) bool { return r.admitted.Admits(pod) }

// against returns the reservations that keep cards from pod, nil for most
// pods.
func (rs *reservations) against(pod *v1.Pod) []*reservation {
	list := rs.current.Load()
	if list == nil {
		return nil
	}
	var out []*reservation
	for _, r := range *list {
		if !r.admits(pod) {
			out = append(out, r)
		}
	}
	return out
}

// reservedOn returns how many cards of node the reservations in against keep
// from the pod.
func reservedOn(against []*reservation, node *v1.Node) int {
	cards := 0
	for _, r := range against {
		if r.selector.Matches(labels.Set(node.Labels)) {
			cards += r.cards
		}
	}
	return cards
}

// reservedReason is the Pending message of a pod the reservations in against
// keep off node.
func reservedReason(against []*reservation, node *v1.Node) string {
	var matching []*reservation
	for _, r := range against {
		if r.selector.Matches(labels.Set(node.Labels)) {
			matching = append(matching, r)
		}
	}
	if len(matching) == 1 {
		return matching[0].reason
	}
	names := make([]string, len(matching))
	for i, r := range matching {
		names[i] = r.name
	}
	return gpus(reservedOn(matching, node)) + " reserved by GPUReservations " + strings.Join(names, ", ")
}

// gpus is "1 GPU" or "n GPUs".
func gpus(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return strconv.Itoa(n) + " GPUs"
}

// parseReservation checks a GPUReservation and builds its reservation.
func parseReservation(obj *unstructured.Unstructured) (*reservation, error) {
	var gr v1alpha1.GPUReservation
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &gr); err != nil {
		return nil, err
	}
	selector, err := gr.Spec.Nodes()
	if err != nil {
		return nil, fmt.Errorf("spec.nodeSelector: %w", err)
	}
	if gr.Spec.Cards < 1 || gr.Spec.Cards > 64 {
		return nil, fmt.Errorf("spec.cards: %d is outside 1-64", gr.Spec.Cards)
	}
	r := &reservation{name: gr.Name, selector: selector, cards: int(gr.Spec.Cards), admitted: gr.Spec.For}
	whom := r.admitted.String()
	if whom == "" {
		return nil, fmt.Errorf("spec.for: names no pods")
	}
	r.reason = gpus(r.cards) + " reserved for " + whom + " by GPUReservation " + r.name
	return r, nil
}

// watchReservations starts an informer over the GPUReservations when their
// CRD is installed and returns its registration (nil when it is not: no
// reservations, said once in the log).
func (f *feed) watchReservations(ctx context.Context, cfg *rest.Config) (cache.ResourceEventHandlerRegistration, error) {
	if cfg == nil {
		return nil, nil
	}
	if ok, err := served(cfg, v1alpha1.Resource); err != nil || !ok {
		if err == nil {
			f.logger.Info("GPUReservation CRD not installed: no GPU capacity is reserved (install manifests/ and restart to use reservations)")
		}
		return nil, err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	informer := dynamicinformer.NewDynamicSharedInformerFactory(client, 0).ForResource(v1alpha1.Resource).Informer()
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f.reloadReservations(informer.GetStore()) },
		UpdateFunc: func(any, any) { f.reloadReservations(informer.GetStore()) },
		DeleteFunc: func(any) { f.reloadReservations(informer.GetStore()) },
	})
	if err != nil {
		return nil, err
	}
	go informer.Run(ctx.Done())
	return reg, nil
}

// reloadReservations rebuilds the reservations from the informer's store and
// retries the pods they kept out.
func (f *feed) reloadReservations(store cache.Store) {
	var list []*reservation
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		r, err := parseReservation(u)
		if err != nil {
			f.logger.Error(err, "GPUReservation is invalid; it reserves nothing", "reservation", klog.KObj(u))
			continue
		}
		list = append(list, r)
	}
	slices.SortFunc(list, func(a, b *reservation) int { return strings.Compare(a.name, b.name) })
	f.reservations.current.Store(&list)
	f.activate(reservationsWaitKey)
}

// served reports whether the API server serves the resource (its CRD is
// installed).
func served(cfg *rest.Config, resource schema.GroupVersionResource) (bool, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, err
	}
	list, err := disco.ServerResourcesForGroupVersion(resource.GroupVersion().String())
	return err == nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == resource.Resource }), nil
}
