package gpushare

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/apis/reservation/v1alpha1"
)

func TestParseReservation(t *testing.T) {
	object := func(spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "tessera.io/v1alpha1", "kind": "GPUReservation",
			"metadata": map[string]any{"name": "critical"}, "spec": spec,
		}}
	}
	for _, tc := range []struct {
		name       string
		spec       map[string]any
		wantReason string
		wantErr    string
	}{
		{name: "by priority", spec: map[string]any{"cards": int64(2), "for": map[string]any{"minPriority": int64(1000)}},
			wantReason: "2 GPUs reserved for priority >= 1000 by GPUReservation critical"},
		{name: "by priority or namespace", spec: map[string]any{"cards": int64(1), "for": map[string]any{"minPriority": int64(5), "namespaces": []any{"prod", "infer"}}},
			wantReason: "1 GPU reserved for priority >= 5 or namespaces prod, infer by GPUReservation critical"},
		{name: "for nobody", spec: map[string]any{"cards": int64(1), "for": map[string]any{}}, wantErr: "spec.for: names no pods"},
		{name: "too many cards", spec: map[string]any{"cards": int64(65), "for": map[string]any{"minPriority": int64(1)}}, wantErr: "spec.cards: 65 is outside 1-64"},
		{name: "bad selector", spec: map[string]any{"cards": int64(1), "for": map[string]any{"minPriority": int64(1)},
			"nodeSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "k", "operator": "Sideways"}}}}, wantErr: "spec.nodeSelector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseReservation(object(tc.spec))
			if testutil.CheckError(t, err, tc.wantErr) {
				return
			}
			if r.reason != tc.wantReason {
				t.Errorf("reason %q, want %q", r.reason, tc.wantReason)
			}
		})
	}
}

func TestReservationAdmits(t *testing.T) {
	prio := int32(1000)
	r := &reservation{admitted: v1alpha1.ReservedFor{MinPriority: &prio, Namespaces: []string{"prod"}}}
	for _, tc := range []struct {
		name string
		pod  *st.PodWrapper
		want bool
	}{
		{"high priority elsewhere", st.MakePod().Namespace("dev").Priority(1000), true},
		{"low priority in the namespace", st.MakePod().Namespace("prod").Priority(1), true},
		{"low priority elsewhere", st.MakePod().Namespace("dev").Priority(999), false},
		{"no priority elsewhere", st.MakePod().Namespace("dev"), false},
	} {
		if got := r.admits(tc.pod.Obj()); got != tc.want {
			t.Errorf("%s: admits = %v, want %v", tc.name, got, tc.want)
		}
	}
}
