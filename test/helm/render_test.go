package helm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The chart and the manifests it is generated from, in this repository.
var (
	chartDir     = filepath.Join("..", "..", "charts", "tessera")
	manifestsDir = filepath.Join("..", "..", "manifests")
)

// kubeVersion is the Kubernetes release the chart is rendered for.
const kubeVersion = "v1.37.2"

// Labels the chart adds to every object and kustomize does not.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	labelChart     = "helm.sh/chart"
)

// configMapPrefix begins the scheduler ConfigMap's name; a hash of its
// content, computed differently by kustomize and by the chart, follows.
const configMapPrefix = "tessera-scheduler-config-"

// object is a rendered Kubernetes object.
type object = map[string]any

// renderChart renders the chart as `helm template` does, with Helm's own
// library: values checked against values.schema.json, templates executed,
// the chart's kubeVersion constraint checked.
func renderChart(t *testing.T, values map[string]any, kube string) ([]object, error) {
	t.Helper()
	chart, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading %s: %v", chartDir, err)
	}
	install := action.NewInstall(action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler)))
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = "tessera"
	install.Namespace = "default"
	if install.KubeVersion, err = common.ParseKubeVersion(kube); err != nil {
		t.Fatal(err)
	}
	rel, err := install.Run(chart, values)
	if err != nil {
		return nil, err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("install returned %T", rel)
	}
	return parseObjects(t, r.Manifest), nil
}

// mustRenderChart renders the chart, failing the test on an error.
func mustRenderChart(t *testing.T, values map[string]any) []object {
	t.Helper()
	objs, err := renderChart(t, values, kubeVersion)
	if err != nil {
		t.Fatalf("rendering the chart with %v: %v", values, err)
	}
	return objs
}

// renderKustomize builds the kustomizations at dirs (relative to
// manifests/) with kustomize's library, as kubectl kustomize does.
func renderKustomize(t *testing.T, dirs ...string) []object {
	t.Helper()
	var objs []object
	for _, dir := range dirs {
		abs, err := filepath.Abs(filepath.Join(manifestsDir, dir))
		if err != nil {
			t.Fatal(err)
		}
		res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		raw, err := res.AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, parseObjects(t, string(raw))...)
	}
	return objs
}

// parseObjects reads a multi-document YAML stream, skipping empty documents.
func parseObjects(t *testing.T, manifest string) []object {
	t.Helper()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var objs []object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("reading the rendered YAML: %v", err)
		}
		var obj object
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("parsing a rendered document: %v\n%s", err, doc)
		}
		if len(obj) > 0 {
			objs = append(objs, obj)
		}
	}
}

// objectKey identifies an object across renderings (the scheduler
// ConfigMap without its hash).
func objectKey(o object) string {
	meta, _ := o["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if o["kind"] == "ConfigMap" && strings.HasPrefix(name, configMapPrefix) {
		name = configMapPrefix + "*"
	}
	ns, _ := meta["namespace"].(string)
	return fmt.Sprintf("%s %s/%s", o["kind"], ns, name)
}

// byKey indexes objects by objectKey, failing on duplicates.
func byKey(t *testing.T, objs []object) map[string]object {
	t.Helper()
	m := map[string]object{}
	for _, o := range objs {
		k := objectKey(o)
		if _, dup := m[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		m[k] = o
	}
	return m
}

// keys returns the map's keys, sorted.
func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// withoutConfigHash replaces the scheduler ConfigMap's hashed name, wherever
// it appears, with the name before its hash; it checks first that every
// reference names the ConfigMap that was rendered.
func withoutConfigHash(t *testing.T, what string, objs []object) []object {
	t.Helper()
	var name string
	for _, o := range objs {
		if n := o["metadata"].(map[string]any)["name"].(string); o["kind"] == "ConfigMap" && strings.HasPrefix(n, configMapPrefix) {
			name = n
		}
	}
	if name == "" {
		t.Fatalf("%s: no scheduler ConfigMap", what)
	}
	var refs int
	out := make([]object, len(objs))
	for i, o := range objs {
		out[i] = mapStrings(o, func(s string) string {
			if s == name {
				refs++
				return configMapPrefix + "*"
			}
			if strings.HasPrefix(s, configMapPrefix) {
				t.Errorf("%s: %s names %s, not the rendered ConfigMap %s", what, objectKey(o), s, name)
			}
			return s
		}).(object)
	}
	if refs < 2 {
		t.Errorf("%s: the ConfigMap %s is named %d times; want it and the scheduler's volume", what, name, refs)
	}
	return out
}

// mapStrings copies v with f applied to every string in it (map keys
// aside).
func mapStrings(v any, f func(string) string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = mapStrings(e, f)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = mapStrings(e, f)
		}
		return out
	case string:
		return f(x)
	}
	return v
}

// withoutChartLabels removes the labels only the chart adds, checking that
// every object has them.
func withoutChartLabels(t *testing.T, objs []object) []object {
	t.Helper()
	for _, o := range objs {
		labels, _ := o["metadata"].(map[string]any)["labels"].(map[string]any)
		if labels[labelManagedBy] != "Helm" || !strings.HasPrefix(fmt.Sprint(labels[labelChart]), "tessera-") {
			t.Errorf("%s: labels %v lack %s: Helm and %s: tessera-<version>", objectKey(o), labels, labelManagedBy, labelChart)
		}
		delete(labels, labelManagedBy)
		delete(labels, labelChart)
	}
	return objs
}

// manifestText is the objects as one YAML text, to search.
func manifestText(t *testing.T, objs []object) string {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		raw, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(raw)
		b.WriteString("---\n")
	}
	return b.String()
}
