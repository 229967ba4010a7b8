package monitoring

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	file       string
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a row's, when collapsed
}

// panels returns every panel but rows, with those inside rows.
func (d *dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// dashboards decodes every dashboard (*.json) in manifests/monitoring.
func dashboards(t *testing.T) []*dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(monitoringDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards (*.json) in %s (%v)", monitoringDir, err)
	}
	var ds []*dashboard
	for _, f := range files {
		b := readFile(t, f)
		if !json.Valid(b) {
			t.Fatalf("%s: not valid JSON", f)
		}
		d := &dashboard{file: f}
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		ds = append(ds, d)
	}
	return ds
}

// The datasource every panel and target names: the one template variable.
const datasourceRef = `{"type":"prometheus","uid":"${datasource}"}`

func TestDashboards(t *testing.T) {
	uids, titles := map[string]string{}, map[string]string{}
	for _, d := range dashboards(t) {
		t.Run(filepath.Base(d.file), func(t *testing.T) {
			// Grafana refuses uids longer than 40 characters.
			if d.UID == "" || len(d.UID) > 40 {
				t.Errorf("uid %q: want 1 to 40 characters", d.UID)
			}
			if other, ok := uids[d.UID]; ok {
				t.Errorf("uid %q also in %s", d.UID, other)
			}
			uids[d.UID] = d.file
			if strings.TrimSpace(d.Title) == "" {
				t.Errorf("no title")
			}
			if other, ok := titles[d.Title]; ok {
				t.Errorf("title %q also in %s", d.Title, other)
			}
			titles[d.Title] = d.file

			// One template variable, the Prometheus data source: every
			// query is plain PromQL.
			vars := d.Templating.List
			if len(vars) != 1 || vars[0].Type != "datasource" || vars[0].Query != "prometheus" || vars[0].Name != "datasource" {
				t.Errorf("template variables %+v: want only {name: datasource, type: datasource, query: prometheus}", vars)
			}

			panels := d.panels()
			if len(panels) == 0 {
				t.Fatalf("no panels")
			}
			ids := map[int]string{}
			for _, p := range panels {
				if other, ok := ids[p.ID]; ok || p.ID == 0 {
					t.Errorf("panel %q: id %d missing or also panel %q's", p.Title, p.ID, other)
				}
				ids[p.ID] = p.Title
				if strings.TrimSpace(p.Title) == "" {
					t.Errorf("panel %d: no title", p.ID)
				}
				if !sameJSON(p.Datasource, datasourceRef) {
					t.Errorf("panel %q: datasource %s, want %s", p.Title, p.Datasource, datasourceRef)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %q: no targets", p.Title)
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if strings.TrimSpace(tg.Expr) == "" {
						t.Errorf("panel %q target %s: empty expr", p.Title, tg.RefID)
					}
					if strings.Contains(tg.Expr, "$") {
						t.Errorf("panel %q target %s: expr %q uses a variable", p.Title, tg.RefID, tg.Expr)
					}
					if tg.RefID == "" || refs[tg.RefID] {
						t.Errorf("panel %q: refId %q missing or repeated", p.Title, tg.RefID)
					}
					refs[tg.RefID] = true
					if !sameJSON(tg.Datasource, datasourceRef) {
						t.Errorf("panel %q target %s: datasource %s, want %s", p.Title, tg.RefID, tg.Datasource, datasourceRef)
					}
				}
			}
		})
	}
}

func sameJSON(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
