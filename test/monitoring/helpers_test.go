package monitoring

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Paths from this package's directory.
var (
	repoRoot      = filepath.Join("..", "..")
	monitoringDir = filepath.Join(repoRoot, "manifests", "monitoring")
	docsPath      = filepath.Join(repoRoot, "docs", "observability.md")
)

// upstreamMetrics are the metrics the rules and the dashboard may name that
// Tessera does not export itself: kube-scheduler's (the scheduler is
// kube-scheduler with Tessera's plugin) and Prometheus' own, each of which
// docs/observability.md mentions by name.
var upstreamMetrics = []string{
	"leader_election_master_status", // client-go's leader election, 1 on the leader
	"up",                            // Prometheus' own: 1 when a target's scrape succeeds
}

// readFile returns the file's content, failing the test when it cannot.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return b
}

var docTableRow = regexp.MustCompile("^\\| `(tessera_[a-zA-Z0-9_]+)`")

// docsMetrics returns the metrics in docs/observability.md's tables: the
// rows that start with "| `tessera_".
func docsMetrics(t *testing.T) map[string]bool {
	t.Helper()
	metrics := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, docsPath)))
	for sc.Scan() {
		if m := docTableRow.FindStringSubmatch(sc.Text()); m != nil {
			metrics[m[1]] = true
		}
	}
	if len(metrics) == 0 {
		t.Fatalf("%s: no table rows starting with \"| `tessera_\"", docsPath)
	}
	return metrics
}

// knownMetrics is docsMetrics plus upstreamMetrics.
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := docsMetrics(t)
	for _, m := range upstreamMetrics {
		known[m] = true
	}
	return known
}

// docsHeadings returns the "### " headings of docs/observability.md (the
// alerts' runbooks), by their GitHub anchor.
func docsHeadings(t *testing.T) map[string]string {
	t.Helper()
	headings := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, docsPath)))
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), "### "); ok {
			headings[githubAnchor(h)] = strings.TrimSpace(h)
		}
	}
	return headings
}

// githubAnchor is the anchor GitHub gives a heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// newParser is the PromQL parser Prometheus uses by default.
func newParser() parser.Parser {
	return parser.NewParser(parser.Options{})
}

// selectedMetrics parses expr and returns the metric names its selectors
// name. A selector without a plain metric name (a regular expression on
// __name__, or none) is an error: it could select anything.
func selectedMetrics(expr string) ([]string, error) {
	ast, err := newParser().ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	var errs []string
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		named := vs.Name != ""
		if named {
			names[vs.Name] = true
		}
		for _, m := range vs.LabelMatchers {
			if m.Name != labels.MetricName {
				continue
			}
			if m.Type != labels.MatchEqual {
				errs = append(errs, fmt.Sprintf("selector %s matches __name__ with %s: name the metric", vs, m.Type))
				continue
			}
			names[m.Value] = true
			named = true
		}
		if !named {
			errs = append(errs, fmt.Sprintf("selector %s names no metric", vs))
		}
		return nil
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// yamlObjects decodes every non-empty document of a multi-document YAML
// file into a generic map.
func yamlObjects(t *testing.T, path string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for i, doc := range docSeparator.Split(string(readFile(t, path)), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

// findObject returns the object of the kind and name in the file.
func findObject(t *testing.T, path, kind, name string) map[string]any {
	t.Helper()
	for _, obj := range yamlObjects(t, path) {
		if obj["kind"] == kind && str(obj, "metadata", "name") == name {
			return obj
		}
	}
	t.Fatalf("%s: no %s %q", path, kind, name)
	return nil
}

// field walks obj along the keys; nil where one is missing.
func field(obj any, keys ...string) any {
	for _, k := range keys {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil
		}
		obj = m[k]
	}
	return obj
}

func str(obj any, keys ...string) string {
	s, _ := field(obj, keys...).(string)
	return s
}

func list(obj any, keys ...string) []any {
	l, _ := field(obj, keys...).([]any)
	return l
}

// stringMap returns the map of strings at keys (labels, matchLabels).
func stringMap(obj any, keys ...string) map[string]string {
	m, _ := field(obj, keys...).(map[string]any)
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}
