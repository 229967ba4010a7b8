package resize

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
)

// TestInProgressBeforeTheInformerSees: of two resizes of one container
// created at once, the second is not taken up while the first is — even
// when the informer has not yet seen the first's status — and is once the
// first is decided or deleted.
func TestInProgressBeforeTheInformerSees(t *testing.T) {
	c := &Controller{informer: cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{podIndex: indexByPod})}
	store := c.informer.GetIndexer()
	put := func(r *v1alpha1.GPUShareResize) {
		t.Helper()
		u, err := r.Unstructured()
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Update(u); err != nil { // adds it when new
			t.Fatal(err)
		}
	}
	resize := func(name, container string) *v1alpha1.GPUShareResize {
		return &v1alpha1.GPUShareResize{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
			Spec: v1alpha1.GPUShareResizeSpec{PodName: "nb", Container: container}}
	}
	first, second, other := resize("first", "main"), resize("second", "main"), resize("other", "sidecar")
	put(first)
	put(second)
	put(other)
	if got := c.inProgress(second); got != "" {
		t.Fatalf("before any is taken up: %q in progress", got)
	}
	// first taken up: its status written, not yet in the informer.
	c.takenUp.Store(containerKey(first), first.Name)
	if got := c.inProgress(second); got != "first" {
		t.Errorf("while the first is taken up (the informer behind): %q in progress, want first", got)
	}
	if got := c.inProgress(other); got != "" {
		t.Errorf("another container's resize: %q in progress, want none", got)
	}
	first.Status.NodeName = "n"
	first.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionApplied, Status: metav1.ConditionTrue, Reason: "Applied"}}
	put(first)
	if got := c.inProgress(second); got != "" {
		t.Errorf("once the first is decided: %q in progress", got)
	}
	c.takenUp.Store(containerKey(second), second.Name)
	if err := store.Delete(mustUnstructured(t, second)); err != nil {
		t.Fatal(err)
	}
	third := resize("third", "main")
	put(third)
	if got := c.inProgress(third); got != "" {
		t.Errorf("after the one taken up was deleted: %q in progress", got)
	}
	if _, ok := c.takenUp.Load(containerKey(third)); ok {
		t.Error("the record of a resize deleted is kept")
	}
}

func mustUnstructured(t *testing.T, r *v1alpha1.GPUShareResize) *unstructured.Unstructured {
	t.Helper()
	u, err := r.Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	return u
}
