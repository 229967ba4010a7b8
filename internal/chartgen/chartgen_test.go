package chartgen

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/manifests"
)

// chartDir is the committed chart.
var chartDir = filepath.Join("..", "..", "charts", "tessera")

// TestChartIsCurrent: the committed chart is what `make chart` generates
// from today's manifests, file for file, with nothing else in templates/.
func TestChartIsCurrent(t *testing.T) {
	files, err := Generate(manifests.FS)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(chartDir, name))
		if err != nil {
			t.Errorf("%v: run make chart", err)
			continue
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("%s is not what make chart generates; run make chart (-generated,+committed):\n%s", name, diff)
		}
	}
	err = fs.WalkDir(os.DirFS(chartDir), "templates", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && files[p] == nil {
			t.Errorf("%s/%s is not generated (make chart removes it): add it to manifests/ instead", chartDir, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestScalarText: every string is written as YAML that a YAML parser reads
// back as the same string (plain, quoted or as a block).
func TestScalarText(t *testing.T) {
	for _, s := range []string{
		"plain", "tessera.io/gpu", "true", "1", "1.5", "null", "~", "", "-", "- a", "a: b", "a:", "#x", "x #y",
		"--v=2", "[a]", "{a}", "*", "&a", "!tag", "'quoted'", `"double"`, "trailing ", " leading", "tab\there",
		"line\nline", "line\nline\n", "line\nline\n\n", "\nleading break", "  indented\nblock", "a\n  more\nless",
		"ünïcode", "x: {{ y }}",
	} {
		n := &kyaml.Node{Kind: kyaml.ScalarNode, Tag: kyaml.NodeTagString, Value: s}
		text, err := scalarText(n, 2)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		var back map[string]string
		if err := yaml.Unmarshal([]byte("k: "+text+"\n"), &back); err != nil {
			t.Errorf("%q written as %q: %v", s, text, err)
			continue
		}
		if back["k"] != s {
			t.Errorf("%q written as %q reads back as %q", s, text, back["k"])
		}
	}
}

// render executes a generated template with the given values, as Helm
// would with just these functions.
func render(t *testing.T, text string, values map[string]any) string {
	t.Helper()
	funcs := template.FuncMap{"has": func(s string, list []string) bool { return slices.Contains(list, s) }}
	tmpl, err := template.New("t").Funcs(funcs).Parse(text)
	if err != nil {
		t.Fatalf("parsing the generated template: %v\n%s", err, text)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, map[string]any{"Values": values}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestGuardProfiles: with every profile on, the configuration is the file
// byte for byte; with some, it parses to those profiles and nothing else
// changes.
func TestGuardProfiles(t *testing.T) {
	config := string(manifests.SchedulerConfig)
	guarded, err := guardProfiles(config, func(l string) string { return l })
	if err != nil {
		t.Fatal(err)
	}
	names, err := profileNames(config)
	if err != nil {
		t.Fatal(err)
	}
	if got := render(t, guarded, map[string]any{"scheduler": map[string]any{"profiles": names}}); got+"\n" != config {
		t.Errorf("every profile on: not the file (-file,+rendered):\n%s", cmp.Diff(config, got+"\n"))
	}
	var whole map[string]any
	if err := yaml.Unmarshal([]byte(config), &whole); err != nil {
		t.Fatal(err)
	}
	for _, keep := range [][]string{{names[0]}, {names[1], names[2]}, {names[2]}} {
		var got map[string]any
		if err := yaml.Unmarshal([]byte(render(t, guarded, map[string]any{"scheduler": map[string]any{"profiles": keep}})), &got); err != nil {
			t.Fatalf("profiles %v: %v", keep, err)
		}
		var want []any
		for _, p := range whole["profiles"].([]any) {
			if slices.Contains(keep, p.(map[string]any)["schedulerName"].(string)) {
				want = append(want, p)
			}
		}
		if diff := cmp.Diff(want, got["profiles"]); diff != "" {
			t.Errorf("profiles %v (-want,+got):\n%s", keep, diff)
		}
	}
}

// parseNode parses YAML into its mapping node.
func parseNode(t *testing.T, s string) *kyaml.Node {
	t.Helper()
	rn, err := kyaml.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return rn.YNode()
}

// TestOverlaysBecomeConditions: each overlay's changes (appended items,
// replaced scalars, added and removed keys) render, with its value on,
// exactly as the overlay's object and, with it off, as the base.
func TestOverlaysBecomeConditions(t *testing.T) {
	base := `
spec:
  args: [--a, --b]
  mode: fast
  gone: here
  items:
    - name: x
      size: 1
    - name: w
      size: 2
`
	overlays := map[string]string{
		"$.Values.one": `
spec:
  args: [--a, --b, --c]
  mode: fast
  gone: here
  items:
    - name: x
      size: 1
    - name: w
      size: 3
  added: {deep: true}
`,
		"$.Values.two": `
spec:
  args: [--z, --b]
  mode: slow
  items:
    - name: x
      size: 1
    - name: w
      size: 2
`,
	}
	var vs []variant
	for _, cond := range []string{"$.Values.one", "$.Values.two"} {
		vs = append(vs, variant{cond: cond, node: parseNode(t, overlays[cond])})
	}
	g := &objectGen{w: &writer{}, namespace: "no-such-namespace"}
	if err := g.mapping(0, parseNode(t, base), vs, ""); err != nil {
		t.Fatal(err)
	}
	text := g.w.b.String()
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"one": false, "two": false}, base},
		{map[string]any{"one": true, "two": false}, overlays["$.Values.one"]},
		{map[string]any{"one": false, "two": true}, overlays["$.Values.two"]},
	} {
		var want, got any
		if err := yaml.Unmarshal([]byte(tc.want), &want); err != nil {
			t.Fatal(err)
		}
		rendered := render(t, text, tc.values)
		if err := yaml.Unmarshal([]byte(rendered), &got); err != nil {
			t.Fatalf("values %v: %v\n%s", tc.values, err, rendered)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("values %v (-want,+got):\n%s\ntemplate:\n%s", tc.values, diff, text)
		}
	}
}

// TestConflictingOverlays: two overlays changing one field cannot both be
// honoured by one template; the generator says where.
func TestConflictingOverlays(t *testing.T) {
	g := &objectGen{w: &writer{}}
	vs := []variant{
		{cond: "$.Values.one", node: parseNode(t, "spec: {mode: slow}")},
		{cond: "$.Values.two", node: parseNode(t, "spec: {mode: fast}")},
	}
	err := g.mapping(0, parseNode(t, "spec: {mode: normal}"), vs, "")
	if err == nil || !strings.Contains(err.Error(), "spec.mode") {
		t.Errorf("got %v, want an error naming spec.mode", err)
	}
}
