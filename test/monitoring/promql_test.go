package monitoring

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// query is one PromQL expression of the monitoring manifests.
type query struct {
	where string // the alert, or the dashboard panel and target
	expr  string
}

func ruleQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, g := range prometheusRule(t).Spec.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			qs = append(qs, query{where: fmt.Sprintf("rule %s/%s", g.Name, name), expr: r.Expr.String()})
		}
	}
	return qs
}

func dashboardQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, d := range dashboards(t) {
		for _, p := range d.panels() {
			for _, tg := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("%s: panel %q target %s", d.file, p.Title, tg.RefID), expr: tg.Expr})
			}
		}
	}
	return qs
}

// TestQueriesNameDocumentedMetrics parses every rule and dashboard query
// with Prometheus' parser and checks that each metric it selects is in
// docs/observability.md's tables (which the main module's tests match
// against the registered metrics) or is one of upstreamMetrics.
func TestQueriesNameDocumentedMetrics(t *testing.T) {
	known := knownMetrics(t)
	qs := append(ruleQueries(t), dashboardQueries(t)...)
	if len(qs) == 0 {
		t.Fatal("no queries found")
	}
	used := map[string]bool{}
	for _, q := range qs {
		t.Run(q.where, func(t *testing.T) {
			if strings.TrimSpace(q.expr) == "" {
				t.Fatalf("empty expression")
			}
			names, err := selectedMetrics(q.expr)
			if err != nil {
				t.Fatalf("%s\n%v", q.expr, err)
			}
			if len(names) == 0 {
				t.Errorf("%s: selects no metric", q.expr)
			}
			for _, n := range names {
				used[n] = true
				if !known[n] {
					t.Errorf("metric %s is neither in the tables of %s nor in upstreamMetrics (query %s)", n, docsPath, q.expr)
				}
			}
		})
	}
	t.Logf("%d queries name %d metrics", len(qs), len(used))
}

// TestUpstreamMetricsDocumented keeps the allowlist honest: each upstream
// metric the manifests may use is named in docs/observability.md.
func TestUpstreamMetricsDocumented(t *testing.T) {
	docs := string(readFile(t, docsPath))
	for _, m := range upstreamMetrics {
		if !strings.Contains(docs, "`"+m) {
			t.Errorf("upstream metric %s is not mentioned in %s", m, docsPath)
		}
	}
}

// TestSelectedMetrics covers the AST walk itself.
func TestSelectedMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr    string
		want    []string
		wantErr bool
	}{
		{expr: "a > 1", want: []string{"a"}},
		{expr: `sum by (x) (rate(a_total[5m])) / on (x) b`, want: []string{"a_total", "b"}},
		{expr: `absent(c{name="x"} == 1)`, want: []string{"c"}},
		{expr: `{__name__="d", job="j"}`, want: []string{"d"}},
		{expr: `topk(3, e) or vector(0)`, want: []string{"e"}},
		{expr: `{__name__=~"tessera_.*"}`, wantErr: true},
		{expr: `{job="j"}`, wantErr: true},
		{expr: `sum(`, wantErr: true},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			got, err := selectedMetrics(tc.expr)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(tc.want)
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
