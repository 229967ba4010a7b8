package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"

	"github.com/tessera-gpu/tessera/pkg/apis/reservation/v1alpha1"
)

// victims lists the pods the scheduler is evicting on the node a pending
// pod is nominated to: lower priority and terminating by preemption. They
// may be evicted for it or for another preemptor there; which is recorded
// in the scheduler's memory only, where it holds the preemptor to the node
// for its own victims alone (docs/design.md, "Preemption").
func victims(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) ([]string, error) {
	node := pod.Status.NominatedNodeName
	if node == "" || pod.Spec.NodeName != "" {
		return nil, nil
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("listing the pods on nominated node %s: %w", node, err)
	}
	var out []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if preemption.PodTerminatingByPreemption(p) && corev1helpers.PodPriority(p) < corev1helpers.PodPriority(pod) {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// keptOut is a GPUReservation that keeps cards from a pod.
type keptOut struct {
	name     string
	selector labels.Selector
	cards    int
	// text says what it keeps and for whom.
	text string
}

// reservationsAgainst lists the GPUReservations that do not admit pod: on
// the nodes they select, they keep whole cards entirely free from it. None
// when the CRD is not installed.
func reservationsAgainst(ctx context.Context, g *globals, pod *v1.Pod) ([]keptOut, error) {
	cfg, err := g.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = requestTimeout
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	list, err := client.Resource(v1alpha1.Resource).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("listing GPUReservations: %w", err)
	}
	var out []keptOut
	for _, item := range list.Items {
		var r v1alpha1.GPUReservation
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &r); err != nil {
			return nil, fmt.Errorf("GPUReservation %s: %w", item.GetName(), err)
		}
		if r.Spec.For.Admits(pod) {
			continue
		}
		selector, err := r.Spec.Nodes()
		if err != nil {
			return nil, fmt.Errorf("GPUReservation %s: spec.nodeSelector: %w", r.Name, err)
		}
		where := "every GPU node"
		if r.Spec.NodeSelector != nil {
			where = "nodes " + selector.String()
		}
		out = append(out, keptOut{name: r.Name, selector: selector, cards: int(r.Spec.Cards),
			text: fmt.Sprintf("GPUReservation %s keeps %d whole card(s) free on %s for %s", r.Name, r.Spec.Cards, where, r.Spec.For)})
	}
	slices.SortFunc(out, func(a, b keptOut) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// reservedOn is how many cards of the node the reservations keep from the
// pod, and which reservations do.
func reservedOn(against []keptOut, nodeLabels map[string]string) (int, []string) {
	cards := 0
	var names []string
	for _, r := range against {
		if r.selector.Matches(labels.Set(nodeLabels)) {
			cards += r.cards
			names = append(names, r.name)
		}
	}
	return cards, names
}
