package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// DocumentedMetrics returns the metric names listed in the table under the
// heading of docs/observability.md (rows starting "| `tessera_"), sorted:
// the reference a component's exported metrics are checked against.
func DocumentedMetrics(t testing.TB, heading string) []string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## "+heading
			continue
		}
		if rest, ok := strings.CutPrefix(line, "| `tessera_"); in && ok {
			name, _, _ := strings.Cut(rest, "`")
			names = append(names, "tessera_"+name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("docs/observability.md lists no metric under %q", heading)
	}
	sort.Strings(names)
	return names
}

// DescName is the metric name in a Prometheus descriptor's String(),
// `Desc{fqName: "name", ...}`.
func DescName(desc string) string {
	_, rest, _ := strings.Cut(desc, `fqName: "`)
	name, _, _ := strings.Cut(rest, `"`)
	return name
}
