package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/manifests"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := Find(objs, kind, name)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestBaseRenders checks what kustomize makes of the base: the objects the
// code and the docs name, the scheduler configuration carried verbatim, and
// the generated ConfigMap's hashed name wherever it is mounted.
func TestBaseRenders(t *testing.T) {
	objs := render(t, Base)
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	cm := find(t, objs, "ConfigMap", manifests.SchedulerConfigMap)
	want := []string{
		"Namespace /tessera-system",
		"CustomResourceDefinition /gpureservations.tessera.io",
		"CustomResourceDefinition /gpushareresizes.tessera.io",
		"ClusterRole /tessera-gpushareresize-edit",
		"ClusterRole /tessera-gpushareresize-view",
		"ServiceAccount tessera-system/tessera-scheduler",
		"ServiceAccount tessera-system/tessera-node-agent",
		"ServiceAccount tessera-system/tessera-metrics-reader",
		"Role tessera-system/tessera-top",
		"Role tessera-system/tessera-viewer",
		"ClusterRole /tessera-viewer",
		"ClusterRoleBinding /tessera-metrics-reader",
		"Role tessera-system/tessera-scheduler",
		"Role tessera-system/tessera-node-agent",
		"ClusterRole /tessera-scheduler",
		"ClusterRole /tessera-node-agent",
		"ClusterRole /tessera-metrics-reader",
		"RoleBinding kube-system/tessera-scheduler-authentication-reader",
		"RoleBinding tessera-system/tessera-scheduler",
		"RoleBinding tessera-system/tessera-node-agent",
		"ClusterRoleBinding /tessera-scheduler",
		"ClusterRoleBinding /tessera-node-agent",
		"ClusterRoleBinding /tessera-node-agent-auth-delegator",
		"ConfigMap tessera-system/" + cm.GetName(),
		"Service tessera-system/tessera-node-agent-metrics",
		"Service tessera-system/tessera-scheduler-metrics",
		"Deployment tessera-system/tessera-scheduler",
		"DaemonSet tessera-system/tessera-node-agent",
		"PodDisruptionBudget tessera-system/tessera-scheduler",
		"PriorityClass /tessera-batch",
		"PriorityClass /tessera-critical",
		"DeviceClass /gpu-share.tessera.io",
		"DeviceClass /gpu.tessera.io",
		"DeviceClass /mig.tessera.io",
		"MutatingAdmissionPolicy /" + PolicySchedulerName,
		"MutatingAdmissionPolicyBinding /" + PolicySchedulerName,
		"MutatingAdmissionPolicy /" + PolicyGPUMemoryTotal,
		"MutatingAdmissionPolicyBinding /" + PolicyGPUMemoryTotal,
	}
	for _, p := range []string{PolicyGPUAssignment, PolicyGPUPodsBoundByTessera, PolicyGPUInventory, PolicyAgentLeases, PolicyAgentPodStatus, PolicyDRASlices, PolicyCDIAnnotations, PolicyHighPriority, PolicyResizeStatus, PolicySchedulerPodUpdates} {
		want = append(want, "ValidatingAdmissionPolicy /"+p, "ValidatingAdmissionPolicyBinding /"+p)
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered objects (-want,+got):\n%s", diff)
	}

	config, err := SchedulerConfig(objs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(manifests.SchedulerConfig), string(config)); diff != "" {
		t.Errorf("the ConfigMap does not carry scheduler/scheduler-config.yaml as it is (-want,+got):\n%s", diff)
	}
	for _, kind := range []string{"Deployment", "DaemonSet"} {
		name := map[string]string{"Deployment": "tessera-scheduler", "DaemonSet": "tessera-node-agent"}[kind]
		spec := podSpec(t, find(t, objs, kind, name))
		mounted := false
		for _, v := range spec.Volumes {
			mounted = mounted || (v.ConfigMap != nil && v.ConfigMap.Name == cm.GetName())
		}
		// The agents must not roll when the scheduler's configuration
		// changes: they take only the resource names, as a flag.
		if want := kind == "Deployment"; mounted != want {
			t.Errorf("%s %s mounts the generated ConfigMap %s: %t, want %t", kind, name, cm.GetName(), mounted, want)
		}
		if img := spec.Containers[0].Image; !regexp.MustCompile(`^ghcr\.io/tessera-gpu/tessera-[a-z-]+:v\d`).MatchString(img) {
			t.Errorf("%s %s runs image %q, not a released one", kind, name, img)
		}
	}
}

func podSpec(t *testing.T, o *unstructured.Unstructured) v1.PodSpec {
	t.Helper()
	raw, found, err := unstructured.NestedMap(o.Object, "spec", "template", "spec")
	if err != nil || !found {
		t.Fatalf("%s %s: no pod template: %v", o.GetKind(), o.GetName(), err)
	}
	var spec v1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// policyResourceNames are the resource names the rendered admission policy
// of that kind and name looks for (its variable resourceNames).
func policyResourceNames(t *testing.T, objs []*unstructured.Unstructured, kind, name string) []string {
	t.Helper()
	vars, _, err := unstructured.NestedSlice(find(t, objs, kind, name).Object, "spec", "variables")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if m := v.(map[string]any); m["name"] == "resourceNames" {
			var names []string
			for _, q := range regexp.MustCompile(`'([^']*)'`).FindAllStringSubmatch(m["expression"].(string), -1) {
				names = append(names, q[1])
			}
			return names
		}
	}
	t.Fatal("the policy has no resourceNames variable")
	return nil
}

// agentResourceNames are the names the rendered DaemonSet gives the node
// agent (--resource-names).
func agentResourceNames(t *testing.T, objs []*unstructured.Unstructured) gpuinfo.ResourceNames {
	t.Helper()
	for _, arg := range podSpec(t, find(t, objs, "DaemonSet", "tessera-node-agent")).Containers[0].Args {
		if text, ok := strings.CutPrefix(arg, "--resource-names="); ok {
			names, err := configv1.ParseResourceNames(text)
			if err != nil {
				t.Fatal(err)
			}
			return names
		}
	}
	t.Fatal("the node agent has no --resource-names")
	return gpuinfo.ResourceNames{}
}

func list(n gpuinfo.ResourceNames) []string {
	return []string{string(n.GPU), string(n.Memory), string(n.MemoryPercent), string(n.Cores)}
}

// TestResourceNamesAgree: the scheduler's configuration, the node agent
// (which reads that configuration) and the admission policy use one set of
// names, in the base and in the hami-names overlay.
func TestResourceNamesAgree(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want gpuinfo.ResourceNames
	}{
		{Base, gpuinfo.DefaultResourceNames()},
		{"overlays/hami-names", gpuinfo.HAMiResourceNames()},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			objs := render(t, tc.dir)
			config, err := SchedulerConfig(objs)
			if err != nil {
				t.Fatal(err)
			}
			names, err := configv1.ResourceNamesIn(config)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, names); diff != "" {
				t.Errorf("scheduler configuration's names (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, agentResourceNames(t, objs)); diff != "" {
				t.Errorf("node agent's names (-want,+got):\n%s", diff)
			}
			for _, p := range [][2]string{{"ValidatingAdmissionPolicy", PolicyGPUPodsBoundByTessera}, {"MutatingAdmissionPolicy", PolicySchedulerName}} {
				if diff := cmp.Diff(list(tc.want), policyResourceNames(t, objs, p[0], p[1])); diff != "" {
					t.Errorf("%s %s's names (-want,+got):\n%s", p[0], p[1], diff)
				}
			}
			// NodeResourcesFit leaves memory and compute to GPUShare and
			// counts cards as kubelet does.
			for _, profile := range profiles(t, config) {
				var got []string
				for _, pc := range profile["pluginConfig"].([]any) {
					if pc := pc.(map[string]any); pc["name"] == "NodeResourcesFit" {
						for _, r := range pc["args"].(map[string]any)["ignoredResources"].([]any) {
							got = append(got, r.(string))
						}
					}
				}
				// Quotas' total of a container's GPU memory is no node's
				// resource either (the policy tessera-gpu-memory-total).
				want := append(list(tc.want)[1:], gpuinfo.Domain+"/gpu-memory-total")
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("profile %s: NodeResourcesFit's ignoredResources (-want,+got):\n%s", profile["schedulerName"], diff)
				}
			}
		})
	}
}

func profiles(t *testing.T, config []byte) []map[string]any {
	t.Helper()
	var cfg struct {
		Profiles []map[string]any `json:"profiles"`
	}
	if err := yaml.Unmarshal(config, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Profiles
}

// TestHAMiOverlayIsTheBaseRenamed: the overlay's copy of the scheduler
// configuration must not drift from the base's: removing its names leaves
// the base's configuration.
func TestHAMiOverlayIsTheBaseRenamed(t *testing.T) {
	base, err := SchedulerConfig(render(t, Base))
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := SchedulerConfig(render(t, "overlays/hami-names"))
	if err != nil {
		t.Fatal(err)
	}
	hami, def := list(gpuinfo.HAMiResourceNames()), list(gpuinfo.DefaultResourceNames())
	var want, got map[string]any
	if err := yaml.Unmarshal(base, &want); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(overlay, &got); err != nil {
		t.Fatal(err)
	}
	for _, profile := range got["profiles"].([]any) {
		for _, pc := range profile.(map[string]any)["pluginConfig"].([]any) {
			args := pc.(map[string]any)["args"].(map[string]any)
			delete(args, "resourceNames")
			if ignored, ok := args["ignoredResources"].([]any); ok {
				for i, r := range ignored {
					if j := slices.Index(hami, r.(string)); j >= 0 {
						ignored[i] = def[j]
					}
				}
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("overlays/hami-names/scheduler-config.yaml, names aside, differs from the base's (-base,+overlay):\n%s", diff)
	}
}

// TestMonitoringRenders builds manifests/monitoring (not part of the
// install; applied on clusters with the Prometheus Operator) with
// kustomize's library: the objects it makes, all in tessera-system but the
// cluster-scoped binding. test/monitoring checks their content.
func TestMonitoringRenders(t *testing.T) {
	objs, err := RenderFS(os.DirFS(filepath.Join("..", "..", "manifests")), "monitoring")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetNamespace() != "tessera-system" {
			t.Errorf("%s %s is in namespace %q, want tessera-system", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(got)
	want := []string{
		"ClusterRoleBinding/tessera-metrics-reader-prometheus",
		"ConfigMap/tessera-grafana-dashboard",
		"PrometheusRule/tessera",
		"ServiceMonitor/tessera-node-agent",
		"ServiceMonitor/tessera-scheduler",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered objects (-want,+got):\n%s", diff)
	}
}

// TestRenderingKeepsValues: kustomize writes its output as YAML text, which
// kubectl (and the tests, and the Helm chart's generator) read back; the text
// must hold the values the manifests' files wrote. It does not for a folded
// (>-) block scalar with more-indented lines, which the YAML encoder writes
// back with an extra line break: write those as literal (|-) blocks.
func TestRenderingKeepsValues(t *testing.T) {
	for _, dir := range []string{Base, "overlays/dra", "overlays/hami-names", "overlays/gang-scheduling", "overlays/dynamic-mig", "overlays/kueue", "monitoring"} {
		nodes, err := RenderNodes(manifests.FS, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			var written any
			if err := n.YNode().Decode(&written); err != nil {
				t.Fatal(err)
			}
			var want, got any
			raw, err := json.Marshal(written)
			if err == nil {
				err = json.Unmarshal(raw, &want)
			}
			if err == nil {
				err = yaml.Unmarshal([]byte(n.MustString()), &got)
			}
			if err != nil {
				t.Fatalf("%s: %s %s: %v", dir, n.GetKind(), n.GetName(), err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: %s %s (-written in the file,+read from kustomize's output):\n%s", dir, n.GetKind(), n.GetName(), diff)
			}
		}
	}
}

// TestGangOverlayAddsTheGate: the base's scheduler runs with the gates the
// test suite's does, and the gang-scheduling overlay is the base with the
// scheduler started with --feature-gates=GenericWorkload=true too (the flag
// adds to the first), nothing else changed (the integration suite runs the
// shipped profiles with that gate on).
func TestGangOverlayAddsTheGate(t *testing.T) {
	args := func(dir string) []string {
		d := find(t, render(t, dir), "Deployment", "tessera-scheduler")
		containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		if err != nil || len(containers) == 0 {
			t.Fatalf("%s: scheduler containers: %v", dir, err)
		}
		list, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		return list
	}
	if !slices.Contains(args(Base), "--feature-gates="+manifests.SchedulerFeatureGates) {
		t.Errorf("the scheduler's Deployment does not set --feature-gates=%s, which the test suite's scheduler runs with", manifests.SchedulerFeatureGates)
	}
	want := append(args(Base), "--feature-gates=GenericWorkload=true")
	if diff := cmp.Diff(want, args("overlays/gang-scheduling")); diff != "" {
		t.Errorf("scheduler args (-want,+got):\n%s", diff)
	}
	if base, overlay := len(render(t, Base)), len(render(t, "overlays/gang-scheduling")); base != overlay {
		t.Errorf("the overlay renders %d objects, the base %d", overlay, base)
	}
}

// TestDRAOverlay: the dra overlay is the base with the node agent started
// with --dra and given kubelet's plugin directories and the runtime's CDI
// directory, at the paths of the agent's flag defaults.
func TestDRAOverlay(t *testing.T) {
	ds := find(t, render(t, "overlays/dra"), "DaemonSet", "tessera-node-agent")
	containers, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		t.Fatalf("agent containers: %v", err)
	}
	agent := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(agent, "args")
	if !slices.Contains(args, "--dra") {
		t.Errorf("agent args %v lack --dra", args)
	}
	mounts, _, _ := unstructured.NestedSlice(agent, "volumeMounts")
	var paths []string
	for _, m := range mounts {
		paths = append(paths, m.(map[string]any)["mountPath"].(string))
	}
	// The defaults of --dra-plugin-dir (under the first), --dra-registrar-dir
	// and --cdi-dir.
	for _, want := range []string{"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"} {
		if !slices.Contains(paths, want) {
			t.Errorf("agent mounts %v lack %s", paths, want)
		}
	}
	if base, overlay := len(render(t, Base)), len(render(t, "overlays/dra")); base != overlay {
		t.Errorf("the overlay renders %d objects, the base %d", overlay, base)
	}
}

// TestPoliciesFollowTheNamespace: no admission policy names Tessera's
// namespace itself. A policy that needs it (to know the scheduler's and the
// agent's ServiceAccounts) takes the Namespace as its parameter, and its
// binding names the Namespace the base creates, so that an install into
// another namespace changes the bindings alone.
func TestPoliciesFollowTheNamespace(t *testing.T) {
	for _, dir := range []string{Base, "overlays/hami-names", "overlays/dra"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			namespace := find(t, objs, "Namespace", manifests.Namespace).GetName()
			policies := 0
			for _, o := range objs {
				if o.GetKind() != "ValidatingAdmissionPolicy" {
					continue
				}
				policies++
				spec, err := yaml.Marshal(o.Object["spec"])
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(spec), namespace) {
					t.Errorf("policy %s names namespace %s: take it from params", o.GetName(), namespace)
				}
				usesParams := strings.Contains(string(spec), "params.")
				kind, _, _ := unstructured.NestedString(o.Object, "spec", "paramKind", "kind")
				if usesParams != (kind == "Namespace") {
					t.Errorf("policy %s: reads params %t, paramKind %q: want Namespace exactly when it reads them", o.GetName(), usesParams, kind)
				}
				binding := find(t, objs, "ValidatingAdmissionPolicyBinding", o.GetName())
				ref, _, _ := unstructured.NestedString(binding.Object, "spec", "paramRef", "name")
				if want := map[bool]string{true: namespace}[usesParams]; ref != want {
					t.Errorf("binding %s: paramRef.name %q, want %q", binding.GetName(), ref, want)
				}
			}
			if policies == 0 {
				t.Fatal("no admission policies rendered")
			}
		})
	}
}
