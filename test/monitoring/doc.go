// Package monitoring tests manifests/monitoring: the PrometheusRule, the
// ServiceMonitors, the Grafana dashboard and their kustomization. Every alert and dashboard query is parsed with Prometheus'
// own parsers and every metric it names is checked against the tables of
// docs/observability.md, which the main module's tests check against the
// metrics the code registers; the main module's integration test
// TestInstalledIdentities scrapes the running scheduler and agent and
// checks that every metric the rules and panels read is served.
//
// A module of its own, so that Prometheus' and the Prometheus Operator's
// dependencies stay out of Tessera's: cd test/monitoring && go test ./...
// (make test-monitoring).
package monitoring
