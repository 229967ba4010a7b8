package cluster

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Kubelet plays the kubelets of simulated nodes for pods being deleted: when
// a pod is terminating (its deletion requested, as preemption does), it
// confirms the deletion, as a kubelet does once the containers have stopped.
// Without it such pods would stay terminating, holding their cards, forever.
type Kubelet struct {
	mu         sync.Mutex
	terminated map[string]string // pod name -> node
}

// StartKubelet confirms the deletions of the namespace's pods (every
// namespace when it is empty) until ctx ends; done is closed then.
func StartKubelet(ctx context.Context, client kubernetes.Interface, namespace string) (k *Kubelet, done <-chan struct{}) {
	k = &Kubelet{terminated: map[string]string{}}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					continue
				}
				if evictedByScheduler(&p) {
					k.mu.Lock()
					k.terminated[p.Namespace+"/"+p.Name] = p.Spec.NodeName
					k.mu.Unlock()
				}
				_ = client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			}
			return false, nil
		})
	}()
	return k, stopped
}

// evictedByScheduler reports whether the scheduler's preemption marked the
// pod (its DisruptionTarget condition) before deleting it. A bound pod that
// a test deletes, even with a grace period of 0, is terminating too until a
// kubelet confirms it: it is no victim.
func evictedByScheduler(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Reason == corev1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}

// Terminated returns the pods (namespace/name) the scheduler evicted whose
// deletion it confirmed, sorted, with the node each was on.
func (k *Kubelet) Terminated() ([]string, map[string]string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	names := make([]string, 0, len(k.terminated))
	nodes := make(map[string]string, len(k.terminated))
	for n, node := range k.terminated {
		names = append(names, n)
		nodes[n] = node
	}
	sort.Strings(names)
	return names, nodes
}

// Preemption is one pod evicted for another, as the scheduler's Preempted
// Event records it.
type Preemption struct {
	// Victim is the evicted pod (namespace/name).
	Victim string
	// Preemptor is the pod it was evicted for (namespace/name), or its UID
	// when no such pod exists any more.
	Preemptor string
	// Node is where the victim ran.
	Node string
	// Delay is how long the Event took from the scheduler's recorder to the
	// API server: its creation time less its eventTime (whole seconds: the
	// creation time has no finer precision).
	Delay time.Duration
}

// Preemptions reads the preemptions of the namespace (every namespace when
// empty) from kube-scheduler's Preempted Events, whose note names the
// preemptor's UID and the node: "Preempted by pod <uid> on node <node>".
func Preemptions(ctx context.Context, client kubernetes.Interface, namespace string) ([]Preemption, error) {
	events, err := client.EventsV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=Preempted"})
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	byUID := map[string]string{}
	for _, p := range pods.Items {
		byUID[string(p.UID)] = p.Namespace + "/" + p.Name
	}
	var out []Preemption
	for _, ev := range events.Items {
		var kind, uid, node string
		if _, err := fmt.Sscanf(ev.Note, "Preempted by %s %s on node %s", &kind, &uid, &node); err != nil {
			continue
		}
		preemptor := byUID[uid]
		if preemptor == "" {
			preemptor = uid
		}
		out = append(out, Preemption{Victim: ev.Regarding.Namespace + "/" + ev.Regarding.Name, Preemptor: preemptor, Node: node,
			Delay: max(ev.CreationTimestamp.Sub(ev.EventTime.Time.Truncate(time.Second)), 0)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Victim < out[j].Victim })
	return out, nil
}
