package monitoring

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// kustomization is the part of kustomization.yaml the tests read.
type kustomization struct {
	Namespace          string   `json:"namespace"`
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name    string   `json:"name"`
		Files   []string `json:"files"`
		Options struct {
			DisableNameSuffixHash bool              `json:"disableNameSuffixHash"`
			Labels                map[string]string `json:"labels"`
		} `json:"options"`
	} `json:"configMapGenerator"`
}

// TestKustomizationListsEveryFile: every file in manifests/monitoring is a
// resource or a generator's file, and every one listed is there.
func TestKustomizationListsEveryFile(t *testing.T) {
	var k kustomization
	path := filepath.Join(monitoringDir, "kustomization.yaml")
	if err := yaml.Unmarshal(readFile(t, path), &k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if k.Namespace != "tessera-system" {
		t.Errorf("%s: namespace %q, want tessera-system", path, k.Namespace)
	}
	listed := slices.Clone(k.Resources)
	dashboardCM := false
	for _, g := range k.ConfigMapGenerator {
		for _, f := range g.Files {
			// A file may be given as key=path.
			if _, p, ok := strings.Cut(f, "="); ok {
				f = p
			}
			listed = append(listed, f)
		}
		if g.Name == "tessera-grafana-dashboard" {
			dashboardCM = true
			if !g.Options.DisableNameSuffixHash || g.Options.Labels["grafana_dashboard"] != "1" {
				t.Errorf("%s: ConfigMap %s wants disableNameSuffixHash: true and label grafana_dashboard: \"1\"", path, g.Name)
			}
			if !slices.Contains(g.Files, "dashboard.json") {
				t.Errorf("%s: ConfigMap %s does not hold dashboard.json", path, g.Name)
			}
		}
	}
	if !dashboardCM {
		t.Errorf("%s: no configMapGenerator tessera-grafana-dashboard", path)
	}
	entries, err := os.ReadDir(monitoringDir)
	if err != nil {
		t.Fatal(err)
	}
	var present []string
	for _, e := range entries {
		if !e.IsDir() && e.Name() != "kustomization.yaml" {
			present = append(present, e.Name())
		}
	}
	slices.Sort(listed)
	slices.Sort(present)
	if diff := cmp.Diff(present, listed); diff != "" {
		t.Errorf("files in %s against those %s lists (-present +listed):\n%s", monitoringDir, path, diff)
	}
}
