package monitoring

import (
	"log/slog"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"
)

var rulePath = filepath.Join(monitoringDir, "prometheusrule.yaml")

// runbookBase is where every alert's runbook_url points, followed by the
// anchor of the alert's heading.
const runbookBase = "https://github.com/tessera-gpu/tessera/blob/main/docs/observability.md"

// prometheusRule decodes prometheusrule.yaml strictly into the operator's
// type: an unknown or misplaced field is an error.
func prometheusRule(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	var rule monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict(readFile(t, rulePath), &rule); err != nil {
		t.Fatalf("%s: strict decoding into a PrometheusRule: %v", rulePath, err)
	}
	if rule.APIVersion != monitoringv1.SchemeGroupVersion.String() || rule.Kind != monitoringv1.PrometheusRuleKind {
		t.Fatalf("%s: apiVersion %q kind %q, want %s %s", rulePath, rule.APIVersion, rule.Kind,
			monitoringv1.SchemeGroupVersion, monitoringv1.PrometheusRuleKind)
	}
	if rule.Name != "tessera" || rule.Namespace != "tessera-system" {
		t.Errorf("%s: PrometheusRule %s/%s, want tessera-system/tessera", rulePath, rule.Namespace, rule.Name)
	}
	if len(rule.Spec.Groups) == 0 {
		t.Fatalf("%s: no rule groups", rulePath)
	}
	return &rule
}

// TestRuleGroupsValid hands every group to Prometheus' own rule file parser
// (rulefmt.Parse, unknown fields refused): the YAML Prometheus loads once
// the operator has written spec.groups into a rule file.
func TestRuleGroupsValid(t *testing.T) {
	prometheusRule(t) // strict decoding first
	obj := findObject(t, rulePath, "PrometheusRule", "tessera")
	groups := list(obj, "spec", "groups")
	for i, g := range groups {
		name := str(g, "name")
		t.Run(name, func(t *testing.T) {
			content, err := yaml.Marshal(map[string]any{"groups": []any{g}})
			if err != nil {
				t.Fatalf("group %d: marshalling: %v", i, err)
			}
			_, errs := rulefmt.Parse(content, false, model.LegacyValidation, newParser(), slog.New(slog.DiscardHandler))
			for _, err := range errs {
				t.Errorf("group %q: rulefmt: %v", name, err)
			}
		})
	}
}

// TestAlerts checks each alert's for, severity, annotations and runbook,
// and that the alerts are exactly docs/observability.md's runbooks.
func TestAlerts(t *testing.T) {
	rule := prometheusRule(t)
	headings := docsHeadings(t)
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			t.Run(r.Alert, func(t *testing.T) {
				if r.For == nil || *r.For == "" {
					t.Errorf("no `for`: a single evaluation would fire it")
				} else if d, err := model.ParseDuration(string(*r.For)); err != nil || d <= 0 {
					t.Errorf("for %q: want a positive duration (%v)", *r.For, err)
				}
				switch sev := r.Labels["severity"]; sev {
				case "warning", "critical":
				default:
					t.Errorf("severity label %q, want warning or critical", sev)
				}
				for _, a := range []string{"summary", "description", "runbook_url"} {
					if strings.TrimSpace(r.Annotations[a]) == "" {
						t.Errorf("no %s annotation", a)
					}
				}
				// A fleet-wide alert has no labels to name (its expression
				// aggregates away the scheduler replicas' instance labels).
				if !fleetWide[r.Alert] && !strings.Contains(r.Annotations["summary"]+r.Annotations["description"], "$labels") {
					t.Errorf("summary and description use no $labels: the notification would not say which node, card or pod")
				}
				// absent() of anything but a bare selector has no labels:
				// $labels would print empty.
				if strings.Contains(r.Expr.StrVal, "absent(") && strings.Contains(r.Annotations["summary"]+r.Annotations["description"], "$labels") {
					t.Errorf("summary or description uses $labels, which absent() leaves empty")
				}
				u, err := url.Parse(r.Annotations["runbook_url"])
				if err != nil {
					t.Fatalf("runbook_url %q: %v", r.Annotations["runbook_url"], err)
				}
				anchor := u.Fragment
				u.Fragment = ""
				if u.String() != runbookBase {
					t.Errorf("runbook_url %q: want %s#<anchor>", r.Annotations["runbook_url"], runbookBase)
				}
				if want := githubAnchor(r.Alert); anchor != want {
					t.Errorf("runbook_url anchor %q, want %q (the alert's name, lower case)", anchor, want)
				}
				if h, ok := headings[anchor]; !ok {
					t.Errorf("runbook_url anchor %q: %s has no heading \"### %s\"", anchor, docsPath, r.Alert)
				} else if h != r.Alert {
					t.Errorf("runbook_url anchor %q is heading %q, want %q", anchor, h, r.Alert)
				}
			})
		}
	}
	// Every runbook in the docs has its alert, and no alert is defined twice.
	var runbooks []string
	for _, h := range headings {
		if strings.HasPrefix(h, "Tessera") {
			runbooks = append(runbooks, h)
		}
	}
	sort.Strings(runbooks)
	sort.Strings(alerts)
	if diff := cmp.Diff(runbooks, alerts); diff != "" {
		t.Errorf("alerts in %s against the runbooks (### Tessera...) in %s (-runbooks +alerts):\n%s", rulePath, docsPath, diff)
	}
}

// fleetWide are the alerts about the whole fleet, whose notifications name
// no node, card or pod.
var fleetWide = map[string]bool{"TesseraGPUFragmentationHigh": true, "TesseraSchedulerNoLeader": true}
