package helm

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestChartMatchesKustomize: the chart rendered with defaults is the
// kustomize base, object for object, and each toggle is the kustomization it
// stands for. Only Helm's two labels and the ConfigMap's hash differ.
func TestChartMatchesKustomize(t *testing.T) {
	on := map[string]any{"enabled": true}
	tests := []struct {
		name      string
		values    map[string]any
		kustomize []string
	}{
		{name: "defaults", kustomize: []string{"."}},
		{name: "dra", values: map[string]any{"dra": on}, kustomize: []string{"overlays/dra"}},
		{name: "hamiNames", values: map[string]any{"hamiNames": on}, kustomize: []string{"overlays/hami-names"}},
		{name: "gangScheduling", values: map[string]any{"gangScheduling": on}, kustomize: []string{"overlays/gang-scheduling"}},
		{name: "dynamicMIG", values: map[string]any{"dynamicMIG": on}, kustomize: []string{"overlays/dynamic-mig"}},
		{name: "monitoring", values: map[string]any{"monitoring": on}, kustomize: []string{".", "monitoring"}},
		{name: "kueue", values: map[string]any{"kueue": on}, kustomize: []string{"overlays/kueue"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := byKey(t, withoutConfigHash(t, "kustomize", renderKustomize(t, tc.kustomize...)))
			got := byKey(t, withoutChartLabels(t, withoutConfigHash(t, "chart", mustRenderChart(t, tc.values))))
			if diff := cmp.Diff(keys(want), keys(got)); diff != "" {
				t.Fatalf("objects (-kustomize,+chart):\n%s", diff)
			}
			for k, w := range want {
				if diff := cmp.Diff(w, got[k]); diff != "" {
					t.Errorf("%s (-kustomize,+chart):\n%s", k, diff)
				}
			}
		})
	}
}

// TestNamespace: namespace.name moves every object, every reference to the
// namespace (service account names in bindings, the policies' parameter,
// the scheduler's leader-election and agent Lease namespaces) and nothing
// else; namespace.create false leaves the Namespace out.
func TestNamespace(t *testing.T) {
	const ns = "gpu-system"
	defaults := withoutConfigHash(t, "defaults", mustRenderChart(t, nil))
	moved := withoutConfigHash(t, ns, mustRenderChart(t, map[string]any{"namespace": map[string]any{"name": ns}}))
	if text := manifestText(t, moved); strings.Contains(text, "tessera-system") {
		t.Errorf("namespace.name=%s still renders tessera-system:\n%s", ns, matchingLines(text, "tessera-system"))
	}
	want := mapStrings(asAny(defaults), func(s string) string { return strings.ReplaceAll(s, "tessera-system", ns) })
	if diff := cmp.Diff(want, any(asAny(moved))); diff != "" {
		t.Errorf("namespace.name=%s: not the defaults with the namespace replaced (-want,+got):\n%s", ns, diff)
	}
	objs := byKey(t, moved)
	for _, k := range []string{"Namespace /" + ns, "Deployment " + ns + "/tessera-scheduler", "DaemonSet " + ns + "/tessera-node-agent", "RoleBinding kube-system/tessera-scheduler-authentication-reader"} {
		if objs[k] == nil {
			t.Errorf("namespace.name=%s renders no %s", ns, k)
		}
	}
	binding := objs["ValidatingAdmissionPolicyBinding /tessera-gpu-assignment"]
	if got := dig(binding, "spec", "paramRef", "name"); got != ns {
		t.Errorf("ValidatingAdmissionPolicyBinding tessera-gpu-assignment: paramRef.name %v, want %s", got, ns)
	}
	config := schedulerConfig(t, moved)
	if got := dig(config, "leaderElection", "resourceNamespace"); got != ns {
		t.Errorf("scheduler configuration: leaderElection.resourceNamespace %v, want %s", got, ns)
	}
	for _, p := range config["profiles"].([]any) {
		for _, pc := range p.(map[string]any)["pluginConfig"].([]any) {
			if pc.(map[string]any)["name"] == "GPUShare" {
				if got := dig(pc.(object), "args", "agentNamespace"); got != ns {
					t.Errorf("profile %v: GPUShare agentNamespace %v, want %s", p.(object)["schedulerName"], got, ns)
				}
			}
		}
	}

	existing := byKey(t, mustRenderChart(t, map[string]any{"namespace": map[string]any{"name": ns, "create": false}}))
	if existing["Namespace /"+ns] != nil {
		t.Errorf("namespace.create=false still renders the Namespace")
	}
	if len(existing) != len(objs)-1 {
		t.Errorf("namespace.create=false renders %d objects, want %d (all but the Namespace)", len(existing), len(objs)-1)
	}
}

// TestImagesAndScheduling: the values an operator sets per install reach
// both workloads' pod specs.
func TestImagesAndScheduling(t *testing.T) {
	tolerations := []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}}
	resources := map[string]any{"requests": map[string]any{"cpu": "1", "memory": "1Gi"}, "limits": nil}
	objs := byKey(t, mustRenderChart(t, map[string]any{
		"image":            map[string]any{"registry": "registry.example.com/mirror", "tag": "v9.9.9", "pullPolicy": "Always"},
		"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
		"scheduler": map[string]any{
			"image":        map[string]any{"repository": "tessera-scheduler", "tag": "v9.9.10"},
			"replicas":     3,
			"nodeSelector": map[string]any{"node-role.kubernetes.io/control-plane": ""},
			"tolerations":  tolerations,
			"resources":    resources,
		},
		"nodeAgent": map[string]any{
			"image": map[string]any{"repository": "agent"},
			// Helm merges maps into the defaults: null removes a default key.
			"nodeSelector": map[string]any{"gpu": "yes", "nvidia.com/gpu.present": nil},
			"tolerations":  []any{},
			"resources":    resources,
		},
	}))
	scheduler := objs["Deployment tessera-system/tessera-scheduler"]
	agent := objs["DaemonSet tessera-system/tessera-node-agent"]
	tests := []struct {
		obj  object
		path []string
		want any
	}{
		{scheduler, []string{"spec", "replicas"}, float64(3)},
		{scheduler, []string{"spec", "template", "spec", "containers", "0", "image"}, "registry.example.com/mirror/tessera-scheduler:v9.9.10"},
		{scheduler, []string{"spec", "template", "spec", "containers", "0", "imagePullPolicy"}, "Always"},
		{scheduler, []string{"spec", "template", "spec", "containers", "0", "resources"}, map[string]any{"requests": resources["requests"]}},
		{scheduler, []string{"spec", "template", "spec", "nodeSelector"}, map[string]any{"node-role.kubernetes.io/control-plane": ""}},
		{scheduler, []string{"spec", "template", "spec", "tolerations"}, tolerations},
		{scheduler, []string{"spec", "template", "spec", "imagePullSecrets"}, []any{map[string]any{"name": "regcred"}}},
		{agent, []string{"spec", "template", "spec", "containers", "0", "image"}, "registry.example.com/mirror/agent:v9.9.9"},
		{agent, []string{"spec", "template", "spec", "containers", "0", "resources"}, map[string]any{"requests": resources["requests"]}},
		{agent, []string{"spec", "template", "spec", "nodeSelector"}, map[string]any{"gpu": "yes"}},
		{agent, []string{"spec", "template", "spec", "tolerations"}, nil},
		{agent, []string{"spec", "template", "spec", "imagePullSecrets"}, []any{map[string]any{"name": "regcred"}}},
	}
	for _, tc := range tests {
		t.Run(objectKey(tc.obj)+" "+strings.Join(tc.path, "."), func(t *testing.T) {
			if diff := cmp.Diff(tc.want, dig(tc.obj, tc.path...)); diff != "" {
				t.Errorf("(-want,+got):\n%s", diff)
			}
		})
	}
}

// TestProfiles: scheduler.profiles chooses the configuration's profiles,
// each as the base writes it, and the namespaces' opt-in label accepts
// exactly those; a different choice is a different ConfigMap, so the
// scheduler rolls.
func TestProfiles(t *testing.T) {
	all := mustRenderChart(t, nil)
	one := mustRenderChart(t, map[string]any{"scheduler": map[string]any{"profiles": []any{"tessera-spread"}}})
	allConfig, oneConfig := schedulerConfig(t, all), schedulerConfig(t, one)
	var spread any
	for _, p := range allConfig["profiles"].([]any) {
		if p.(object)["schedulerName"] == "tessera-spread" {
			spread = p
		}
	}
	if diff := cmp.Diff([]any{spread}, oneConfig["profiles"]); diff != "" {
		t.Errorf("profiles [tessera-spread] (-want,+got):\n%s", diff)
	}
	delete(allConfig, "profiles")
	delete(oneConfig, "profiles")
	if diff := cmp.Diff(allConfig, oneConfig); diff != "" {
		t.Errorf("the rest of the configuration changed with the profiles (-want,+got):\n%s", diff)
	}
	policy := byKey(t, one)["MutatingAdmissionPolicy /tessera-scheduler-name"]
	values := dig(policy, "spec", "matchConstraints", "namespaceSelector", "matchExpressions", "0", "values")
	if diff := cmp.Diff([]any{"tessera-spread"}, values); diff != "" {
		t.Errorf("tessera-scheduler-name's namespace label values (-want,+got):\n%s", diff)
	}
	if a, b := configMapName(t, all), configMapName(t, one); a == b {
		t.Errorf("the ConfigMap keeps its name %s when the configuration changes: the scheduler would not roll", a)
	}
}

// TestCombinedToggles: the toggles compose, each making its own change to
// the same objects.
func TestCombinedToggles(t *testing.T) {
	on := map[string]any{"enabled": true}
	objs := byKey(t, mustRenderChart(t, map[string]any{"dra": on, "hamiNames": on, "gangScheduling": on, "monitoring": on}))
	args := func(kind, name string) []any {
		return dig(objs[kind+" tessera-system/"+name], "spec", "template", "spec", "containers", "0", "args").([]any)
	}
	agentArgs, schedulerArgs := args("DaemonSet", "tessera-node-agent"), args("Deployment", "tessera-scheduler")
	for _, want := range []string{"--dra", "--resource-names=gpu=nvidia.com/gpu,memory=nvidia.com/gpumem,memoryPercent=nvidia.com/gpumem-percentage,cores=nvidia.com/gpucores"} {
		if !slices.Contains(agentArgs, any(want)) {
			t.Errorf("agent args %v lack %s", agentArgs, want)
		}
	}
	if !slices.Contains(schedulerArgs, any("--feature-gates=GenericWorkload=true")) {
		t.Errorf("scheduler args %v lack the GenericWorkload gate", schedulerArgs)
	}
	if objs["PrometheusRule tessera-system/tessera"] == nil {
		t.Errorf("monitoring.enabled renders no PrometheusRule")
	}
}

// TestRefusals: values the chart cannot honour fail the render with a
// message naming the value (as a JSON pointer), before anything reaches a
// cluster.
func TestRefusals(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		kube   string
		want   string
	}{
		{name: "namespace not a DNS label", values: map[string]any{"namespace": map[string]any{"name": "GPU_System"}}, want: "/namespace/name"},
		{name: "unknown profile", values: map[string]any{"scheduler": map[string]any{"profiles": []any{"tessera-fastest"}}}, want: "/scheduler/profiles/0"},
		{name: "no profile", values: map[string]any{"scheduler": map[string]any{"profiles": []any{}}}, want: "/scheduler/profiles"},
		{name: "no replica", values: map[string]any{"scheduler": map[string]any{"replicas": 0}}, want: "/scheduler/replicas"},
		{name: "misspelt key", values: map[string]any{"schedular": map[string]any{"replicas": 3}}, want: "schedular"},
		{name: "pull secret as a string", values: map[string]any{"imagePullSecrets": []any{"regcred"}}, want: "/imagePullSecrets/0"},
		{name: "toggle not a boolean", values: map[string]any{"dra": map[string]any{"enabled": "yes"}}, want: "/dra/enabled"},
		{name: "Kubernetes too old", kube: "v1.36.4", want: "kubeVersion"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kube := tc.kube
			if kube == "" {
				kube = kubeVersion
			}
			_, err := renderChart(t, tc.values, kube)
			if err == nil {
				t.Fatalf("rendered; want an error naming %s", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

// schedulerConfig parses the configuration in the rendered scheduler
// ConfigMap.
func schedulerConfig(t *testing.T, objs []object) object {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == "ConfigMap" && strings.HasPrefix(dig(o, "metadata", "name").(string), configMapPrefix) {
			var config object
			if err := yaml.Unmarshal([]byte(dig(o, "data", "scheduler-config.yaml").(string)), &config); err != nil {
				t.Fatalf("the scheduler configuration: %v", err)
			}
			return config
		}
	}
	t.Fatal("no scheduler ConfigMap")
	return nil
}

// configMapName is the rendered scheduler ConfigMap's name.
func configMapName(t *testing.T, objs []object) string {
	t.Helper()
	for _, o := range objs {
		if name := dig(o, "metadata", "name").(string); o["kind"] == "ConfigMap" && strings.HasPrefix(name, configMapPrefix) {
			return name
		}
	}
	t.Fatal("no scheduler ConfigMap")
	return ""
}

// dig returns the value at path (map keys, or list indices as digits), or
// nil.
func dig(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i := 0
			for _, c := range p {
				i = i*10 + int(c-'0')
			}
			if i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// asAny converts objects to a []any, as mapStrings returns lists.
func asAny(objs []object) []any {
	out := make([]any, len(objs))
	for i, o := range objs {
		out[i] = o
	}
	return out
}

// matchingLines are the lines of text containing s.
func matchingLines(text, s string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
