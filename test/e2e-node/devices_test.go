//go:build e2enode

package e2enode

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/manifests"
)

// TestCDIAnnotations: a pod's cdi.k8s.io annotation — which kubelet passes
// with the sandbox, never with a container — opens no card in containerd;
// and where a runtime would honour it (here: the same annotation on the
// container, as a runtime reading the sandbox's or a device plugin's answer
// would bring it), the agent refuses the container that ends up with a
// card's device node it was not assigned, whatever name brought it.
func TestCDIAnnotations(t *testing.T) {
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	all := map[string]string{"cdi.k8s.io/tenant": "nvidia.com/gpu=all"}
	plain := podSpec(ns, "annotated", "")
	second := podSpec(ns, "reannotated", "")
	share := podSpec(ns, "sharer", "", container{name: "main", limits: map[string]int64{"tessera.io/gpu-memory": 4096}})
	pods := schedule(tCtx, plain, second, share)
	// The admission policy tessera-cdi-annotations refuses the annotation
	// (integration TestAdmissionPolicies); the node must hold without it, as
	// for a pod admitted before the policy: kubelet hands the pod's
	// annotations to the sandbox.
	for _, p := range pods {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		maps.Copy(p.Annotations, all)
	}

	// As kubelet passes it: with the sandbox only.
	plainBox := runSandbox(tCtx, pods["annotated"], "")
	checkNoGPU(t, "a pod annotated with every card", startContainer(tCtx, plainBox, pods["annotated"], "main"))

	assigned := cardsOf(tCtx, pods["sharer"], "main")[0].Index
	other := (assigned + 1) % cards
	shareBox := runSandbox(tCtx, pods["sharer"], "")
	for _, tc := range []struct {
		what, pod  string
		sb         *sandbox
		annotation string
		wantErr    string
	}{
		{"every card on a container without GPUs", "reannotated", runSandbox(tCtx, pods["reannotated"], ""), "nvidia.com/gpu=all", "which is not a card it was assigned"},
		{"another card beside a share", "sharer", shareBox, fmt.Sprint("nvidia.com/gpu=", other), fmt.Sprintf("device /dev/nvidia%d (card minor %d), which is not a card it was assigned", other, other)},
		{"its own card", "sharer", shareBox, fmt.Sprint("nvidia.com/gpu=", assigned), ""},
	} {
		_, err := createAsKubeletWith(tCtx, tc.sb, pods[tc.pod], "main", extra{annotations: map[string]string{"cdi.k8s.io/tenant": tc.annotation}})
		checkRefusal(t, tc.what, err, tc.wantErr)
	}
}

// checkRefusal checks a CreateContainer's answer: success when wantErr is
// empty, else the agent's refusal containing wantErr.
func checkRefusal(t *testing.T, what string, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%s: %v", what, err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Errorf("%s: CreateContainer returned %v, want the agent's refusal %q", what, err, wantErr)
	}
}

// TestPrivilegedContainers: a privileged container gets every GPU device
// node of the host. The agent's own pod, as the DaemonSet ships it, runs so
// (that is how its cards reach it where the toolkit refuses
// NVIDIA_VISIBLE_DEVICES from unprivileged containers; its old way, a pod
// annotation, brings nothing); a tenant's privileged container is refused.
func TestPrivilegedContainers(t *testing.T) {
	hostGPUNodes(t)
	tCtx := ktesting.Init(t)
	ns := testNamespace(tCtx)
	tenant := podSpec(ns, "privileged", "")
	tenant.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: new(bool)}
	*tenant.Spec.Containers[0].SecurityContext.Privileged = true
	pod := schedule(tCtx, tenant)["privileged"]
	_, err := createAsKubelet(tCtx, runSandbox(tCtx, pod, ""), pod, "main")
	if err == nil || !strings.Contains(err.Error(), "which is not a card it was assigned") {
		t.Errorf("a tenant's privileged container: CreateContainer returned %v, want the agent's refusal", err)
	}

	agent := agentPod(tCtx, "agent", nil)
	r := startContainer(tCtx, runSandbox(tCtx, agent, ""), agent, "agent")
	var want []string
	for i := range cards {
		want = append(want, fmt.Sprint("nvidia", i))
	}
	if got := r.devices(); !containsAll(got, append(want, "nvidiactl")) {
		t.Errorf("the agent's container sees %v, want every card and /dev/nvidiactl", got)
	}

	// The DaemonSet's earlier way: unprivileged, every card asked for by a
	// pod annotation. Kubelet passes it with the sandbox; containerd's CDI
	// injection reads only the container's annotations.
	old := agentPod(tCtx, "agent-old-way", func(p *v1.Pod) {
		p.Annotations = map[string]string{"cdi.k8s.io/tessera-node-agent": "nvidia.com/gpu=all"}
		p.Spec.Containers[0].SecurityContext.Privileged = nil
	})
	if got := startContainer(tCtx, runSandbox(tCtx, old, ""), old, "agent").devices(); len(got) != 0 {
		t.Errorf("the annotation brought devices %v: the DaemonSet's privilege may not be needed", got)
	}
}

// agentPod creates, bound to node, a pod name of the agent's DaemonSet as
// the base ships it (the test image in place of the agent's), changed by
// mutate when given.
func agentPod(tCtx ktesting.TContext, name string, mutate func(*v1.Pod)) *v1.Pod {
	tCtx.Helper()
	objs, err := install.RenderFS(manifests.FS, ".")
	if err != nil {
		tCtx.Fatal(err)
	}
	obj, err := install.Find(objs, "DaemonSet", "tessera-node-agent")
	if err != nil {
		tCtx.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &ds); err != nil {
		tCtx.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: ds.Spec.Template.ObjectMeta, Spec: ds.Spec.Template.Spec}
	pod.Name, pod.Namespace, pod.Spec.NodeName = name, manifests.Namespace, node
	pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts = nil, nil
	pod.Spec.Containers[0].Image = image
	if mutate != nil {
		mutate(pod)
	}
	pod, err = suite.cp.Client.CoreV1().Pods(manifests.Namespace).Create(tCtx, pod, metav1.CreateOptions{})
	if err != nil {
		tCtx.Fatal(err)
	}
	tCtx.Cleanup(func() {
		_ = suite.cp.Client.CoreV1().Pods(manifests.Namespace).Delete(tCtx, pod.Name, metav1.DeleteOptions{})
	})
	return pod
}

func containsAll(got, want []string) bool {
	have := map[string]bool{}
	for _, g := range got {
		have[g] = true
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}

// hostGPUNodes gives the host the GPU device nodes a privileged container
// gets: /dev/nvidia<i> and /dev/nvidiactl with NVIDIA's numbers. Where the
// host has no NVIDIA driver they are stand-ins (opening one fails), made
// for the test and removed after it; a host's own nodes are left alone.
func hostGPUNodes(t *testing.T) {
	paths := map[string]int{"/dev/nvidiactl": 255}
	for i := range cards {
		paths[fmt.Sprint("/dev/nvidia", i)] = i
	}
	for path, minor := range paths {
		err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(195, uint32(minor))))
		switch {
		case errors.Is(err, os.ErrExist):
		case err != nil:
			t.Fatalf("making the stand-in %s: %v", path, err)
		default:
			t.Cleanup(func() { _ = os.Remove(path) })
		}
	}
}
