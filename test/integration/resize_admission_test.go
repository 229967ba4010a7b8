package integration

import (
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	resizev1alpha1 "github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
)

// dynamicAs is a dynamic client for cfg.
func dynamicAs(t interface {
	Helper()
	Fatal(...any)
}, cfg *rest.Config) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// impersonating is the control plane's config acting as user and groups.
func impersonating(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(controlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// resizeObject is a GPUShareResize of pod's container with spec fields.
func resizeObject(name, pod string, spec map[string]any) *unstructured.Unstructured {
	spec["podName"], spec["container"] = pod, "main"
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": resizev1alpha1.Resource.GroupVersion().String(),
		"kind":       resizev1alpha1.Kind,
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

// TestResizeAdmission: who may ask for a resize and who may write its
// status, under the shipped roles and policies. A tenant bound to the
// shipped tessera-gpushareresize-edit role (which the built-in edit and
// admin roles aggregate) creates resizes of pods in their namespace but
// cannot change one or write any status, nor can a cluster admin or a
// namespace owner with every right there; the scheduler writes status (and
// creates resizes, for right-sizing), and a node agent only its own
// condition on a resize of a pod on its node.
func TestResizeAdmission(t *testing.T) {
	e := newEnv(t)
	nodeA := e.node("a", cluster.L4, 1, nil)
	nodeB := e.node("b", cluster.L4, 1, nil)
	admin := dynamicAs(t, controlPlane.Config).Resource(resizev1alpha1.Resource).Namespace(e.ns)
	rbac := e.client.RbacV1()
	if _, err := rbac.RoleBindings(e.ns).Create(e.tCtx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bob-resizes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "tessera-gpushareresize-edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// carol owns the namespace with a role granting every resource.
	if _, err := rbac.Roles(e.ns).Create(e.tCtx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "owner"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(e.ns).Create(e.tCtx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "carol-owner"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "owner"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "carol"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bob := dynamicAs(t, impersonating("bob")).Resource(resizev1alpha1.Resource).Namespace(e.ns)
	carol := dynamicAs(t, impersonating("carol")).Resource(resizev1alpha1.Resource).Namespace(e.ns)
	scheduler := dynamicAs(t, install.AsScheduler(controlPlane.Config)).Resource(resizev1alpha1.Resource).Namespace(e.ns)
	agentA := dynamicAs(t, install.AsAgent(controlPlane.Config, nodeA)).Resource(resizev1alpha1.Resource).Namespace(e.ns)
	agentB := dynamicAs(t, install.AsAgent(controlPlane.Config, nodeB)).Resource(resizev1alpha1.Resource).Namespace(e.ns)

	var created *unstructured.Unstructured
	e.waitFor(30*time.Second, "bob's role binding to take effect", func() (bool, error) {
		var err error
		// The status a tenant sends is dropped: only the status subresource
		// writes it.
		r := resizeObject("grow", "notebook", map[string]any{"memory": "12Gi", "cores": int64(40)})
		r.Object["status"] = map[string]any{"nodeName": nodeA}
		created, err = bob.Create(e.tCtx, r, metav1.CreateOptions{})
		return err == nil, nil
	})
	if _, found, _ := unstructured.NestedMap(created.Object, "status"); found {
		t.Errorf("the status bob sent with his resize was kept: %v", created.Object["status"])
	}
	// The controller's record: the pod runs on node a.
	recorded := created.DeepCopy()
	if err := unstructured.SetNestedField(recorded.Object, map[string]any{
		"nodeName": nodeA,
		"to":       []any{map[string]any{"index": int64(0), "memoryMiB": int64(12288), "cores": int64(40)}},
		"conditions": []any{map[string]any{
			"type": resizev1alpha1.ConditionPending, "status": "True", "reason": "WaitingForLimits", "message": "m",
			"lastTransitionTime": "2026-12-07T00:00:00Z",
		}},
	}, "status"); err != nil {
		t.Fatal(err)
	}
	stored, err := scheduler.UpdateStatus(e.tCtx, recorded, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("the scheduler writes a resize's status: %v", err)
	}
	// withStatus returns the stored resize with its status changed by edit.
	withStatus := func(edit func(status map[string]any)) *unstructured.Unstructured {
		r := stored.DeepCopy()
		status := r.Object["status"].(map[string]any)
		edit(status)
		return r
	}
	limitsWritten := func(status map[string]any) {
		status["conditions"] = append(status["conditions"].([]any), map[string]any{
			"type": resizev1alpha1.ConditionLimitsWritten, "status": "True", "reason": "Written", "message": "m",
			"lastTransitionTime": "2026-12-07T00:00:01Z",
		})
	}
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, tc := range []struct {
		name, want string
		do         func() error
	}{
		{"a tenant asks for neither memory nor cores", "CRD", func() error {
			_, err := bob.Create(e.tCtx, resizeObject("nothing", "notebook", map[string]any{}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"a namespace owner changes a resize's share", "CRD", func() error {
			r := stored.DeepCopy()
			_ = unstructured.SetNestedField(r.Object, "20Gi", "spec", "memory")
			_, err := carol.Update(e.tCtx, r, dry)
			return err
		}},
		{"a tenant writes a resize's status", deniedByRBAC, func() error {
			_, err := bob.UpdateStatus(e.tCtx, withStatus(limitsWritten), dry)
			return err
		}},
		{"a namespace owner with every right writes a resize's status", install.PolicyResizeStatus, func() error {
			_, err := carol.UpdateStatus(e.tCtx, withStatus(limitsWritten), dry)
			return err
		}},
		{"a cluster admin writes a resize's status", install.PolicyResizeStatus, func() error {
			_, err := admin.UpdateStatus(e.tCtx, withStatus(limitsWritten), dry)
			return err
		}},
		{"the agent of the pod's node reports the limits written", allowed, func() error {
			_, err := agentA.UpdateStatus(e.tCtx, withStatus(limitsWritten), dry)
			return err
		}},
		{"another node's agent reports the limits written", install.PolicyResizeStatus, func() error {
			_, err := agentB.UpdateStatus(e.tCtx, withStatus(limitsWritten), dry)
			return err
		}},
		{"another node's agent moves the resize to its own node", install.PolicyResizeStatus, func() error {
			_, err := agentB.UpdateStatus(e.tCtx, withStatus(func(s map[string]any) { s["nodeName"] = nodeB }), dry)
			return err
		}},
		{"the agent of the pod's node changes the share asked", install.PolicyResizeStatus, func() error {
			_, err := agentA.UpdateStatus(e.tCtx, withStatus(func(s map[string]any) {
				s["to"] = []any{map[string]any{"index": int64(0), "memoryMiB": int64(20480), "cores": int64(40)}}
			}), dry)
			return err
		}},
		{"the agent of the pod's node marks the resize applied", install.PolicyResizeStatus, func() error {
			_, err := agentA.UpdateStatus(e.tCtx, withStatus(func(s map[string]any) {
				s["conditions"] = []any{map[string]any{
					"type": resizev1alpha1.ConditionApplied, "status": "True", "reason": "Applied", "message": "m",
					"lastTransitionTime": "2026-12-07T00:00:01Z",
				}}
			}), dry)
			return err
		}},
		{"a node agent creates a resize", deniedByRBAC, func() error {
			_, err := agentA.Create(e.tCtx, resizeObject("agent", "notebook", map[string]any{"cores": int64(10)}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"the scheduler creates a resize (automatic right-sizing)", allowed, func() error {
			_, err := scheduler.Create(e.tCtx, resizeObject("scheduler", "notebook", map[string]any{"cores": int64(10)}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if tc.want == "CRD" {
				if !apierrors.IsInvalid(err) {
					t.Errorf("got %v, want the CRD's validation to refuse it", err)
				}
				return
			}
			checkAnswer(t, err, tc.want)
		})
	}
}
