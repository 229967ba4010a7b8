package testutil

import (
	"encoding/json"
	"regexp"
	"sort"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/manifests"
)

// tesseraMetric matches Tessera's metric names in a PromQL expression; no
// label or function name begins with tessera_.
var tesseraMetric = regexp.MustCompile(`\btessera_[a-z0-9_]*[a-z0-9]\b`)

// AlertMetrics returns Tessera's metric names that the shipped alert rules
// and dashboard panels read (manifests/monitoring), sorted. test/monitoring
// parses the same expressions with Prometheus' parser and checks each name
// against docs/observability.md; this list is for checking them against
// what the running components serve.
func AlertMetrics(t testing.TB) []string {
	t.Helper()
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Expr string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	raw, err := manifests.FS.ReadFile("monitoring/prometheusrule.yaml")
	if err == nil {
		err = yaml.Unmarshal(raw, &rule)
	}
	if err != nil {
		t.Fatalf("monitoring/prometheusrule.yaml: %v", err)
	}
	var exprs []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []panel `json:"panels"`
	}
	var dashboard panel
	raw, err = manifests.FS.ReadFile("monitoring/dashboard.json")
	if err == nil {
		err = json.Unmarshal(raw, &dashboard)
	}
	if err != nil {
		t.Fatalf("monitoring/dashboard.json: %v", err)
	}
	var walk func(p panel)
	walk = func(p panel) {
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
		for _, sub := range p.Panels {
			walk(sub)
		}
	}
	walk(dashboard)
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, name := range tesseraMetric.FindAllString(e, -1) {
			seen[name] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("the alert rules and the dashboard read no tessera_ metric: the expressions were not found")
	}
	return names
}
