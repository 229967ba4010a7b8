package chartgen

import (
	"fmt"
	"slices"
	"strings"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

// Template text the generated files use for what values decide.
const (
	namespaceAction = `{{ $.Values.namespace.name }}`
	profilesAction  = `{{ toJson $.Values.scheduler.profiles }}`
	configMapPrefix = "tessera-scheduler-config-"
	configMapAction = configMapPrefix + `{{ include "tessera.schedulerConfigHash" $ }}`
	// helmLabels are added to every object's labels.
	helmLabels = `{{- include "tessera.labels" $ | nindent %d }}`
)

// Paths (keys joined by dots, "[]" for a sequence's items) of the fields a
// workload's values set.
const (
	pathReplicas         = "spec.replicas"
	pathPodSpec          = "spec.template.spec"
	pathContainerImage   = "spec.template.spec.containers[].image"
	pathContainerRes     = "spec.template.spec.containers[].resources"
	pathObjectLabels     = "metadata.labels"
	pathConfigData       = "data." + configKey
	configKey            = "scheduler-config.yaml"
	valuesNodeSelector   = "nodeSelector"
	valuesTolerations    = "tolerations"
	podSpecImagePullKeys = "imagePullSecrets"
)

// workload is a Deployment or DaemonSet whose pod spec values shape.
type workload struct {
	values string // its key in values.yaml: scheduler, nodeAgent
	// What the base sets, the values' defaults.
	replicas   *kyaml.Node
	image      string
	resources  *kyaml.Node
	scheduling map[string]*kyaml.Node // nodeSelector, tolerations
}

// objectGen writes the template of one object.
type objectGen struct {
	w         *writer
	namespace string // the base's namespace, written as namespaceAction
	configMap string // the scheduler ConfigMap's hashed name in the base
	profiles  []string
	workload  *workload // nil for objects values do not shape
	isConfig  bool      // the scheduler's ConfigMap
}

// text is a scalar's YAML text with Helm's braces escaped and the values'
// parts (namespace, scheduler ConfigMap name) put in.
func (g *objectGen) text(n *kyaml.Node, indent int) (string, error) {
	t, err := scalarText(n, indent)
	if err != nil {
		return "", err
	}
	t = escapeBraces(t)
	if g.configMap != "" {
		t = strings.ReplaceAll(t, g.configMap, configMapAction)
	}
	return strings.ReplaceAll(t, g.namespace, namespaceAction), nil
}

// mapping writes mapping base's entries at indent, with the variants' changes.
func (g *objectGen) mapping(indent int, base *kyaml.Node, vs []variant, path string) error {
	written := map[string]bool{}
	for i := 0; i+1 < len(base.Content); i += 2 {
		key, val := base.Content[i], base.Content[i+1]
		written[key.Value] = true
		var sub []variant
		var without []string
		for _, v := range vs {
			if n := lookup(v.node, key.Value); n != nil {
				sub = append(sub, variant{v.cond, n})
			} else {
				without = append(without, v.cond)
			}
		}
		if len(without) > 1 {
			return errConflict(join(path, key.Value), vs)
		}
		if len(without) == 1 {
			g.w.action("if not " + without[0])
		}
		if err := g.entry(indent, key, val, sub, join(path, key.Value)); err != nil {
			return err
		}
		if len(without) == 1 {
			g.w.action("end")
		}
	}
	for _, v := range vs {
		var added [][2]*kyaml.Node
		for i := 0; i+1 < len(v.node.Content); i += 2 {
			if !written[v.node.Content[i].Value] {
				added = append(added, [2]*kyaml.Node{v.node.Content[i], v.node.Content[i+1]})
			}
		}
		if len(added) == 0 {
			continue
		}
		g.w.action("if " + v.cond)
		for _, kv := range added {
			if err := g.entry(indent, kv[0], kv[1], nil, join(path, kv[0].Value)); err != nil {
				return err
			}
		}
		g.w.action("end")
	}
	return g.extras(indent, path, written)
}

// entry writes key: base at indent, with the variants' changes.
func (g *objectGen) entry(indent int, keyNode, base *kyaml.Node, vs []variant, path string) error {
	g.w.comment(indent, keyNode.HeadComment)
	key, err := g.text(keyNode, indent)
	if err != nil {
		return err
	}
	vs = changed(base, vs)
	if done, err := g.hook(indent, key, base, vs, path); done {
		return err
	}
	sameKind := true
	for _, v := range vs {
		sameKind = sameKind && v.node.Kind == base.Kind
	}
	switch {
	case len(vs) == 0 && base.Kind == kyaml.MappingNode && len(base.Content) == 0:
		g.w.line(indent, key+": {}")
	case len(vs) == 0 && base.Kind == kyaml.SequenceNode && len(base.Content) == 0:
		g.w.line(indent, key+": []")
	case len(vs) == 0 && base.Kind == kyaml.SequenceNode && g.isProfiles(base):
		g.w.line(indent, key+": "+profilesAction)
	case sameKind && base.Kind == kyaml.MappingNode && len(base.Content) > 0:
		g.w.line(indent, key+":")
		return g.mapping(indent+2, base, vs, path)
	case sameKind && base.Kind == kyaml.SequenceNode && len(base.Content) > 0:
		g.w.line(indent, key+":")
		return g.sequence(indent+2, base, vs, path)
	case len(vs) == 0 && base.Kind == kyaml.ScalarNode:
		t, err := g.text(base, indent+2)
		if err != nil {
			return err
		}
		g.w.line(indent, key+": "+t)
	case len(vs) == 1:
		// The whole entry, one way or the other.
		bare := uncommented(keyNode)
		g.w.action("if " + vs[0].cond)
		if err := g.entry(indent, bare, vs[0].node, nil, path); err != nil {
			return err
		}
		g.w.action("else")
		if err := g.entry(indent, bare, base, nil, path); err != nil {
			return err
		}
		g.w.action("end")
	default:
		return errConflict(path, vs)
	}
	return nil
}

// sequence writes sequence base's items at indent. A variant either appends
// items (written under its condition) or keeps the length and changes items
// in place.
func (g *objectGen) sequence(indent int, base *kyaml.Node, vs []variant, path string) error {
	var inPlace, appended []variant
	for _, v := range vs {
		switch n := len(base.Content); {
		case v.node.Kind != kyaml.SequenceNode:
			return errConflict(path, []variant{v})
		case len(v.node.Content) > n && equal(base, &kyaml.Node{Kind: kyaml.SequenceNode, Content: v.node.Content[:n]}):
			appended = append(appended, v)
		case len(v.node.Content) == n:
			inPlace = append(inPlace, v)
		default:
			return errConflict(path, []variant{v})
		}
	}
	for i, item := range base.Content {
		var sub []variant
		for _, v := range inPlace {
			sub = append(sub, variant{v.cond, v.node.Content[i]})
		}
		if err := g.item(indent, item, sub, path+"[]"); err != nil {
			return err
		}
	}
	for _, v := range appended {
		g.w.action("if " + v.cond)
		for _, item := range v.node.Content[len(base.Content):] {
			if err := g.item(indent, item, nil, path+"[]"); err != nil {
				return err
			}
		}
		g.w.action("end")
	}
	return nil
}

// item writes one sequence item at indent.
func (g *objectGen) item(indent int, base *kyaml.Node, vs []variant, path string) error {
	g.w.comment(indent, base.HeadComment)
	vs = changed(base, vs)
	if len(vs) > 0 && (base.Kind != kyaml.MappingNode || vs[0].node.Kind != kyaml.MappingNode) {
		if len(vs) > 1 {
			return errConflict(path, vs)
		}
		g.w.action("if " + vs[0].cond)
		if err := g.item(indent, uncommented(vs[0].node), nil, path); err != nil {
			return err
		}
		g.w.action("else")
		if err := g.item(indent, uncommented(base), nil, path); err != nil {
			return err
		}
		g.w.action("end")
		return nil
	}
	switch base.Kind {
	case kyaml.ScalarNode:
		t, err := g.text(base, indent+2)
		if err != nil {
			return err
		}
		g.w.line(indent, "- "+t)
	case kyaml.MappingNode:
		if len(base.Content) == 0 {
			g.w.line(indent, "- {}")
			return nil
		}
		g.w.dashOwed, g.w.dashIndent = true, indent
		return g.mapping(indent+2, base, vs, path)
	default:
		return fmt.Errorf("%s: a sequence in a sequence: the generator does not write those", path)
	}
	return nil
}

// uncommented is n without its head comment, written once above both
// alternatives.
func uncommented(n *kyaml.Node) *kyaml.Node {
	c := *n
	c.HeadComment = ""
	return &c
}

// isProfiles reports whether seq lists the scheduler's profiles, a list the
// chart's scheduler.profiles replaces.
func (g *objectGen) isProfiles(seq *kyaml.Node) bool {
	names := make([]string, len(seq.Content))
	for i, n := range seq.Content {
		names[i] = n.Value
	}
	return slices.Equal(names, g.profiles)
}

// hook writes the fields values set, reporting whether it wrote key.
func (g *objectGen) hook(indent int, key string, base *kyaml.Node, vs []variant, path string) (bool, error) {
	switch {
	case g.isConfig && path == pathConfigData:
		g.w.line(indent, key+": |")
		g.w.line(indent+2, fmt.Sprintf(`{{- include "tessera.schedulerConfig" $ | nindent %d }}`, indent+2))
		return true, nil // the overlays' configurations are in the include
	case g.workload == nil:
		return false, nil
	case path == pathReplicas:
		g.workload.replicas = base
		g.w.line(indent, fmt.Sprintf("%s: {{ $.Values.%s.replicas }}", key, g.workload.values))
	case path == pathContainerImage:
		if g.workload.image != "" {
			return true, fmt.Errorf("%s: more than one container; the chart's values describe one", path)
		}
		g.workload.image = base.Value
		g.w.line(indent, fmt.Sprintf(`%s: {{ include "tessera.image" (dict "root" $ "image" $.Values.%s.image) }}`, key, g.workload.values))
		g.w.action("with $.Values.image.pullPolicy")
		g.w.line(indent, "imagePullPolicy: {{ . }}")
		g.w.action("end")
	case path == pathContainerRes:
		g.workload.resources = base
		g.valuesBlock(indent, key, g.workload.values+".resources")
	case path == join(pathPodSpec, valuesNodeSelector) || path == join(pathPodSpec, valuesTolerations):
		g.workload.scheduling[key] = base
		g.valuesBlock(indent, key, g.workload.values+"."+key)
	case path == join(pathPodSpec, podSpecImagePullKeys):
		return true, fmt.Errorf("%s: the chart sets this from imagePullSecrets; the manifests must not", path)
	default:
		return false, nil
	}
	if len(vs) > 0 {
		return true, fmt.Errorf("%s: an overlay changes a field the chart's values set", path)
	}
	return true, nil
}

// extras writes what values add to the mapping at path, after its entries.
func (g *objectGen) extras(indent int, path string, written map[string]bool) error {
	switch {
	case path == pathObjectLabels:
		g.w.b.WriteString(fmt.Sprintf(helmLabels, indent) + "\n")
	case g.workload != nil && path == pathPodSpec:
		for _, key := range []string{valuesNodeSelector, valuesTolerations} {
			if !written[key] {
				g.valuesBlock(indent, key, g.workload.values+"."+key)
			}
		}
		g.valuesBlock(indent, podSpecImagePullKeys, podSpecImagePullKeys)
	}
	return nil
}

// valuesBlock writes key with the YAML of the value at valuesPath, or
// nothing where that value is empty.
func (g *objectGen) valuesBlock(indent int, key, valuesPath string) {
	g.w.action("with $.Values." + valuesPath)
	g.w.line(indent, key+":")
	g.w.b.WriteString(fmt.Sprintf("{{- toYaml . | nindent %d }}\n", indent+2))
	g.w.action("end")
}

// join appends key to a dotted path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
