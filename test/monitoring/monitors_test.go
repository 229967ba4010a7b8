package monitoring

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

var (
	agentDaemonSetPath  = filepath.Join(repoRoot, "manifests", "base", "node-agent", "daemonset.yaml")
	schedulerDeployPath = filepath.Join(repoRoot, "manifests", "base", "scheduler", "deployment.yaml")
	metricsReaderPath   = filepath.Join(repoRoot, "manifests", "base", "metrics-reader.yaml")
)

// decodeStrict decodes a manifest strictly into the operator's type.
func decodeStrict(t *testing.T, path string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(readFile(t, path), into); err != nil {
		t.Fatalf("%s: strict decoding into %T: %v", path, into, err)
	}
}

// missingLabels returns the labels of selector that labels lacks or holds
// with another value.
func missingLabels(selector, labels map[string]string) []string {
	var out []string
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			out = append(out, fmt.Sprintf("%s=%s (have %q)", k, v, got))
		}
	}
	slices.Sort(out)
	return out
}

// containerPortNames returns the names of the pod template's container ports.
func containerPortNames(workload map[string]any) []string {
	var names []string
	for _, c := range list(workload, "spec", "template", "spec", "containers") {
		for _, p := range list(c, "ports") {
			names = append(names, str(p, "name"))
		}
	}
	return names
}

// selectsNamespace reports whether a monitor in ownNS with sel scrapes ns.
func selectsNamespace(sel monitoringv1.NamespaceSelector, ownNS, ns string) bool {
	if sel.Any {
		return true
	}
	if len(sel.MatchNames) == 0 {
		return ownNS == ns
	}
	return slices.Contains(sel.MatchNames, ns)
}

// TestServiceMonitors checks that each ServiceMonitor selects its
// component's metrics Service, that the Service reaches the component's
// pods on a container port, and that the endpoints speak to the secure
// port: HTTPS with the self-signed certificate and a token it reviews.
func TestServiceMonitors(t *testing.T) {
	for _, tc := range []struct {
		monitor, workloadPath, workloadKind, workload, service string
		// honorLabels: the series carry their own namespace, pod and
		// container labels, which would otherwise become exported_*.
		honorLabels bool
	}{
		{"servicemonitor.yaml", schedulerDeployPath, "Deployment", "tessera-scheduler", "tessera-scheduler-metrics", false},
		{"agent-servicemonitor.yaml", agentDaemonSetPath, "DaemonSet", "tessera-node-agent", "tessera-node-agent-metrics", true},
	} {
		t.Run(tc.monitor, func(t *testing.T) {
			path := filepath.Join(monitoringDir, tc.monitor)
			var sm monitoringv1.ServiceMonitor
			decodeStrict(t, path, &sm)
			if sm.Kind != monitoringv1.ServiceMonitorsKind {
				t.Fatalf("%s: kind %q, want %s", path, sm.Kind, monitoringv1.ServiceMonitorsKind)
			}
			svc := findObject(t, tc.workloadPath, "Service", tc.service)
			workload := findObject(t, tc.workloadPath, tc.workloadKind, tc.workload)
			if len(sm.Spec.Selector.MatchLabels) == 0 || len(sm.Spec.Selector.MatchExpressions) > 0 {
				t.Errorf("%s: want a selector of matchLabels only, got %+v", path, sm.Spec.Selector)
			}
			if miss := missingLabels(sm.Spec.Selector.MatchLabels, stringMap(svc, "metadata", "labels")); len(miss) > 0 {
				t.Errorf("%s: selector labels %v not on Service %s", path, miss, tc.service)
			}
			if ns := str(svc, "metadata", "namespace"); !selectsNamespace(sm.Spec.NamespaceSelector, sm.Namespace, ns) {
				t.Errorf("%s: namespaceSelector %+v does not select the Service's namespace %q", path, sm.Spec.NamespaceSelector, ns)
			}
			// The Service itself reaches the component's secure port.
			if miss := missingLabels(stringMap(svc, "spec", "selector"), stringMap(workload, "spec", "template", "metadata", "labels")); len(miss) > 0 {
				t.Errorf("%s: Service %s selects %v, not on the %s's pods", tc.workloadPath, tc.service, miss, tc.workloadKind)
			}
			svcPorts := map[string]any{}
			for _, p := range list(svc, "spec", "ports") {
				svcPorts[str(p, "name")] = field(p, "targetPort")
				if tp, ok := field(p, "targetPort").(string); ok && !slices.Contains(containerPortNames(workload), tp) {
					t.Errorf("%s: Service port %s targets %q, not a container port of %s", tc.workloadPath, str(p, "name"), tp, tc.workload)
				}
			}
			if len(sm.Spec.Endpoints) == 0 {
				t.Fatalf("%s: no endpoints", path)
			}
			for i, ep := range sm.Spec.Endpoints {
				if _, ok := svcPorts[ep.Port]; !ok {
					t.Errorf("%s: endpoints[%d].port %q is not a port of Service %s (%v)", path, i, ep.Port, tc.service, svcPorts)
				}
				if ep.Path != "" && ep.Path != "/metrics" {
					t.Errorf("%s: endpoints[%d].path %q, the component serves /metrics", path, i, ep.Path)
				}
				if ep.Scheme == nil || !strings.EqualFold(string(*ep.Scheme), "https") {
					t.Errorf("%s: endpoints[%d].scheme %v, want https", path, i, ep.Scheme)
				}
				if ep.BearerTokenFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
					t.Errorf("%s: endpoints[%d].bearerTokenFile %q, want the pod's ServiceAccount token", path, i, ep.BearerTokenFile)
				}
				if tls := ep.TLSConfig; tls == nil || tls.InsecureSkipVerify == nil || !*tls.InsecureSkipVerify {
					t.Errorf("%s: endpoints[%d].tlsConfig.insecureSkipVerify must be true (self-signed certificate)", path, i)
				}
				if ep.HonorLabels != tc.honorLabels {
					t.Errorf("%s: endpoints[%d].honorLabels %t, want %t", path, i, ep.HonorLabels, tc.honorLabels)
				}
			}
		})
	}
}

// TestPrometheusBinding checks that the binding grants the ClusterRole the
// base defines for reading /metrics.
func TestPrometheusBinding(t *testing.T) {
	path := filepath.Join(monitoringDir, "prometheus-binding.yaml")
	objs := yamlObjects(t, path)
	if len(objs) != 1 || objs[0]["kind"] != "ClusterRoleBinding" {
		t.Fatalf("%s: want one ClusterRoleBinding", path)
	}
	b := objs[0]
	if str(b, "roleRef", "kind") != "ClusterRole" || str(b, "roleRef", "name") != "tessera-metrics-reader" {
		t.Errorf("%s: roleRef %v, want ClusterRole tessera-metrics-reader", path, field(b, "roleRef"))
	}
	role := findObject(t, metricsReaderPath, "ClusterRole", "tessera-metrics-reader")
	grants := false
	for _, r := range list(role, "rules") {
		urls, verbs := fmt.Sprint(field(r, "nonResourceURLs")), fmt.Sprint(field(r, "verbs"))
		if strings.Contains(urls, "/metrics") && strings.Contains(verbs, "get") {
			grants = true
		}
	}
	if !grants {
		t.Errorf("%s: ClusterRole tessera-metrics-reader does not grant get on /metrics", metricsReaderPath)
	}
	subjects := list(b, "subjects")
	if len(subjects) == 0 {
		t.Fatalf("%s: no subjects", path)
	}
	for i, s := range subjects {
		if str(s, "kind") != "ServiceAccount" || str(s, "name") == "" || str(s, "namespace") == "" {
			t.Errorf("%s: subjects[%d] %v, want a ServiceAccount with name and namespace", path, i, s)
		}
	}
}
