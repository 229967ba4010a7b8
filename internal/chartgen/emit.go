package chartgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"
)

// variant is an overlay's version of a node, emitted where its condition
// holds.
type variant struct {
	cond string // a template pipeline, such as .Values.dra.enabled
	node *kyaml.Node
}

// writer builds a template file line by line. A sequence item that is a
// mapping starts with its first entry on the "- " line; until that line is
// written the dash is owed.
type writer struct {
	b          strings.Builder
	dashIndent int
	dashOwed   bool
}

// line writes text at indent, taking an owed dash.
func (w *writer) line(indent int, text string) {
	if w.dashOwed {
		w.dashOwed = false
		w.b.WriteString(strings.Repeat(" ", w.dashIndent) + "- ")
		w.b.WriteString(strings.Repeat(" ", indent-w.dashIndent-2))
	} else {
		w.b.WriteString(strings.Repeat(" ", indent))
	}
	w.b.WriteString(text)
	w.b.WriteByte('\n')
}

// action writes a template action on a line of its own; its "{{-" removes
// the line break before it, so the rendered YAML has no trace of it.
func (w *writer) action(text string) {
	if w.dashOwed {
		w.dashOwed = false
		w.b.WriteString(strings.Repeat(" ", w.dashIndent) + "-\n")
	}
	w.b.WriteString("{{- " + text + " }}\n")
}

// comment writes a node's head comment at indent, its braces escaped.
func (w *writer) comment(indent int, c string) {
	if c == "" {
		return
	}
	for l := range strings.SplitSeq(c, "\n") {
		w.line(indent, escapeBraces(strings.TrimRight(l, " ")))
	}
}

// escapeBraces makes text that Helm's template engine would read as an
// action (Prometheus' {{ $labels.node }}) print as it is.
func escapeBraces(s string) string {
	return strings.ReplaceAll(s, "{{", `{{ "{{" }}`)
}

// plainSafe matches strings YAML reads back as the same string when written
// without quotes (the check for other types, such as "true", follows).
var plainSafe = regexp.MustCompile(`^[A-Za-z0-9/_.\-][A-Za-z0-9 /_.:=,@*+\-]*$`)

// scalarText is a scalar as YAML text following "key: " or "- ", where its
// block lines (if any) sit at indent. Strings are plain where YAML reads them
// back unchanged, literal blocks where they span lines, double-quoted
// otherwise.
func scalarText(n *kyaml.Node, indent int) (string, error) {
	if n.ShortTag() != kyaml.NodeTagString {
		return n.Value, nil
	}
	s := n.Value
	if strings.Contains(s, "\n") && !strings.ContainsAny(s, "\t\r") && !strings.HasPrefix(s, " ") {
		return literalBlock(s, indent), nil
	}
	if plainSafe.MatchString(s) && !strings.Contains(s, ": ") && !strings.HasSuffix(s, " ") && !strings.HasSuffix(s, ":") {
		var back any
		if err := yaml.Unmarshal([]byte(s), &back); err == nil && back == s {
			return s, nil
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// literalBlock writes s as a YAML literal block scalar with its lines at
// indent, choosing the chomping indicator that keeps its final line breaks.
func literalBlock(s string, indent int) string {
	header := "|-"
	body := s
	switch {
	case strings.HasSuffix(s, "\n\n"):
		header, body = "|+", strings.TrimSuffix(s, "\n")
	case strings.HasSuffix(s, "\n"):
		header, body = "|", strings.TrimSuffix(s, "\n")
	}
	var b strings.Builder
	b.WriteString(header)
	pad := strings.Repeat(" ", indent)
	for l := range strings.SplitSeq(body, "\n") {
		b.WriteByte('\n')
		if l != "" {
			b.WriteString(pad + l)
		}
	}
	return b.String()
}

// equal reports whether two nodes hold the same data (comments, styles and
// the order of mapping keys aside).
func equal(a, b *kyaml.Node) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Kind != b.Kind || len(a.Content) != len(b.Content) {
		return false
	}
	switch a.Kind {
	case kyaml.ScalarNode:
		return a.Value == b.Value && a.ShortTag() == b.ShortTag()
	case kyaml.MappingNode:
		// In any order: a JSON patch writes a patched object's keys sorted.
		for i := 0; i+1 < len(a.Content); i += 2 {
			if !equal(a.Content[i+1], lookup(b, a.Content[i].Value)) {
				return false
			}
		}
		return true
	}
	for i := range a.Content {
		if !equal(a.Content[i], b.Content[i]) {
			return false
		}
	}
	return true
}

// changed returns the variants whose node differs from base.
func changed(base *kyaml.Node, vs []variant) []variant {
	var out []variant
	for _, v := range vs {
		if !equal(base, v.node) {
			out = append(out, v)
		}
	}
	return out
}

// lookup returns the value under key in mapping m, or nil.
func lookup(m *kyaml.Node, key string) *kyaml.Node {
	if m == nil || m.Kind != kyaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// errConflict is returned where two overlays change the same field: one
// template cannot hold both choices.
func errConflict(path string, vs []variant) error {
	conds := make([]string, len(vs))
	for i, v := range vs {
		conds[i] = v.cond
	}
	return fmt.Errorf("%s: changed by %s at once, or in a way the generator cannot merge", path, strings.Join(conds, " and "))
}
