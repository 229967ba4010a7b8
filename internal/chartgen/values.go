package chartgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/template"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/tessera-gpu/tessera/manifests"
)

// image is a container image reference split as the chart's values split it.
type image struct {
	Registry, Repository, Tag string
}

// parseImage splits registry/repository:tag at the last slash and colon.
func parseImage(ref string) (image, error) {
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if slash < 0 || colon < slash {
		return image{}, fmt.Errorf("image %q: want registry/repository:tag", ref)
	}
	return image{Registry: ref[:slash], Repository: ref[slash+1 : colon], Tag: ref[colon+1:]}, nil
}

// chartData is what the chart's own files are written from.
type chartData struct {
	Namespace             string
	Registry, Tag         string
	ChartVersion          string
	Scheduler, NodeAgent  component
	Profiles              []string
	Config                string            // the base configuration, profiles guarded
	ConfigAlternatives    map[string]string // by condition: an overlay's configuration
	ConfigAlternativeKeys []string
}

// component is a workload's values' defaults, as YAML text.
type component struct {
	Repository                           string
	Replicas                             string
	NodeSelector, Tolerations, Resources string
}

// newComponent reads a workload's defaults from what the base set.
func newComponent(wl *workload, indent int) (component, image, error) {
	img, err := parseImage(wl.image)
	if err != nil {
		return component{}, image{}, fmt.Errorf("%s: %w", wl.values, err)
	}
	c := component{Repository: img.Repository}
	if wl.replicas != nil {
		c.Replicas = wl.replicas.Value
	}
	c.Resources = block(wl.resources, indent, "{}")
	c.NodeSelector = block(wl.scheduling[valuesNodeSelector], indent, "{}")
	c.Tolerations = block(wl.scheduling[valuesTolerations], indent, "[]")
	return c, img, nil
}

// block is n as YAML following "key:" at indent-2 (a new line, or empty
// when n is nil or empty).
func block(n *kyaml.Node, indent int, empty string) string {
	if n == nil || len(n.Content) == 0 {
		return " " + empty
	}
	s := strings.TrimSuffix(kyaml.NewRNode(n).MustString(), "\n")
	pad := strings.Repeat(" ", indent)
	return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

// chartFiles writes Chart.yaml, values.yaml, values.schema.json, the helpers
// and NOTES.txt.
func chartFiles(scheduler, agent *workload, profiles []string, config string, alternatives map[string]string) (map[string][]byte, error) {
	s, simg, err := newComponent(scheduler, 4)
	if err != nil {
		return nil, err
	}
	a, aimg, err := newComponent(agent, 4)
	if err != nil {
		return nil, err
	}
	if simg.Registry != aimg.Registry || simg.Tag != aimg.Tag {
		return nil, fmt.Errorf("the images %s and %s differ in registry or tag; the chart's values hold one of each", scheduler.image, agent.image)
	}
	if s.Replicas == "" {
		return nil, fmt.Errorf("the scheduler's Deployment sets no replicas")
	}
	d := chartData{
		Namespace:          manifests.Namespace,
		Registry:           simg.Registry,
		Tag:                simg.Tag,
		ChartVersion:       strings.TrimPrefix(simg.Tag, "v"),
		Scheduler:          s,
		NodeAgent:          a,
		Profiles:           profiles,
		Config:             config,
		ConfigAlternatives: alternatives,
	}
	for k := range alternatives {
		d.ConfigAlternativeKeys = append(d.ConfigAlternativeKeys, k)
	}
	sort.Strings(d.ConfigAlternativeKeys)
	files := map[string][]byte{}
	for name, tmpl := range chartTemplates {
		var b bytes.Buffer
		if err := tmpl.Execute(&b, d); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		files[name] = b.Bytes()
	}
	schema, err := json.MarshalIndent(valuesSchema(profiles), "", "  ")
	if err != nil {
		return nil, err
	}
	files["values.schema.json"] = append(schema, '\n')
	return files, nil
}

// chartTemplates are the chart's own files, written from chartData.
// Their actions are in [[ ]], leaving {{ }} to Helm.
var chartTemplates = map[string]*template.Template{
	"Chart.yaml":             parse("Chart.yaml", chartYAML),
	"values.yaml":            parse("values.yaml", valuesYAML),
	"templates/_helpers.tpl": parse("_helpers.tpl", helpersTPL),
	"templates/NOTES.txt":    parse("NOTES.txt", notesTXT),
}

func parse(name, text string) *template.Template {
	return template.Must(template.New(name).Delims("[[", "]]").Parse(text))
}

const chartYAML = generatedHeader + `apiVersion: v2
name: tessera
description: >-
  Tessera, a GPU-share-aware second scheduler for Kubernetes: per-card
  placement of GPU memory and compute shares, with a node agent that
  applies each container's share.
type: application
version: [[ .ChartVersion ]]
appVersion: [[ .Tag ]]
# The base uses APIs of Kubernetes 1.37 (MutatingAdmissionPolicy, DRA's v1
# device classes, kube-scheduler 1.37's configuration).
kubeVersion: ">=1.37.0-0"
home: https://github.com/tessera-gpu/tessera
sources:
  - https://github.com/tessera-gpu/tessera
keywords: [gpu, scheduler, kubernetes, gpu-sharing]
annotations:
  licenses: Apache-2.0
`

const valuesYAML = generatedHeader + `# Defaults are what manifests/ (the kustomize base) installs: with them,
# helm template renders the same objects as kubectl kustomize manifests (the
# test module test/helm checks it). values.schema.json refuses anything else.

# Where both components, their Leases and the agents' heartbeat Leases live.
# The admission policies read it (their parameter is this Namespace), so
# change it here and nowhere else.
namespace:
  name: [[ .Namespace ]]
  # Create the Namespace, labelled for the agent's privileged pods. With
  # false, it must exist and carry pod-security.kubernetes.io/enforce:
  # privileged.
  create: true

# Images: <registry>/<repository>:<tag>.
image:
  registry: [[ .Registry ]]
  # Empty: the chart's appVersion ([[ .Tag ]]).
  tag: ""
  # Empty: Kubernetes' default (IfNotPresent for a tag).
  pullPolicy: ""
# Secrets to pull both images with: [{name: my-registry}].
imagePullSecrets: []

scheduler:
  image:
    repository: [[ .Scheduler.Repository ]]
    # Empty: image.tag.
    tag: ""
  # One leads (Lease tessera-scheduler), the others stand by; the replicas
  # go to different nodes.
  replicas: [[ .Scheduler.Replicas ]]
  # The scheduler profiles to run (at least one): pods name one in
  # spec.schedulerName, namespaces in the label tessera.io/scheduler-profile.
  profiles:
[[- range .Profiles ]]
    - [[ . ]]
[[- end ]]
  nodeSelector:[[ .Scheduler.NodeSelector ]]
  tolerations:[[ .Scheduler.Tolerations ]]
  resources:[[ .Scheduler.Resources ]]

nodeAgent:
  image:
    repository: [[ .NodeAgent.Repository ]]
    # Empty: image.tag.
    tag: ""
  # The GPU nodes: the agent runs on every node these select.
  nodeSelector:[[ .NodeAgent.NodeSelector ]]
  tolerations:[[ .NodeAgent.Tolerations ]]
  resources:[[ .NodeAgent.Resources ]]

# manifests/overlays/dra: the agents serve the cards as DRA devices; pods
# ask with ResourceClaims instead of extended resources (docs/claims.md).
dra:
  enabled: false
# manifests/overlays/hami-names: pods keep HAMi's resource names
# (nvidia.com/gpu, gpumem, gpumem-percentage, gpucores).
hamiNames:
  enabled: false
# manifests/overlays/gang-scheduling: PodGroup gangs (the API server must
# serve scheduling.k8s.io/v1beta1 with the GenericWorkload gate on).
gangScheduling:
  enabled: false
# manifests/overlays/dynamic-mig: the agents make and destroy the MIG slices
# of every card in MIG mode as pods need them (docs/mig.md); cards NVIDIA's
# MIG manager owns must not be on such nodes.
dynamicMIG:
  enabled: false
# manifests/monitoring: alerts, ServiceMonitors and the Grafana dashboard
# (the Prometheus Operator's CRDs must be installed).
monitoring:
  enabled: false
# manifests/overlays/kueue: example Kueue queues — a ResourceFlavor per GPU
# model, two teams' ClusterQueues in a cohort, LocalQueues in team-a and
# team-b (docs/queues.md). Kueue must be installed, and the namespaces exist.
kueue:
  enabled: false
`

const helpersTPL = generatedHeader + `{{/* An image reference: root is the top-level context, image a component's image values. */}}
{{- define "tessera.image" -}}
{{- with .root.Values.image.registry }}{{ . }}/{{ end }}{{ .image.repository }}:{{ .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* The labels Helm's own tooling expects, added to every object's. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The scheduler's KubeSchedulerConfiguration: manifests/base/scheduler/scheduler-config.yaml
(an overlay's where that overlay is on), with the profiles scheduler.profiles names.
*/}}
{{- define "tessera.schedulerConfig" -}}
[[- range $i, $cond := .ConfigAlternativeKeys ]]
{{- [[ if $i ]]else [[ end ]]if [[ $cond ]] -}}
[[ index $.ConfigAlternatives $cond ]]
[[- end ]]
[[- if .ConfigAlternativeKeys ]]
{{- else -}}
[[- end ]]
[[ .Config ]]
[[- if .ConfigAlternativeKeys ]]
{{- end }}
[[- end ]]
{{- end }}

{{/* The start of the configuration's SHA-256, in the ConfigMap's name: a change rolls the scheduler. */}}
{{- define "tessera.schedulerConfigHash" -}}
{{- include "tessera.schedulerConfig" . | sha256sum | trunc 10 }}
{{- end }}
`

const notesTXT = `Tessera is installed in namespace {{ .Values.namespace.name }}: the scheduler
({{ .Values.scheduler.replicas }} replicas; profiles {{ join ", " .Values.scheduler.profiles }}) and the node
agent, on the nodes its nodeSelector picks.

Pods opt in with spec.schedulerName set to a profile, or in namespaces labelled
  tessera.io/scheduler-profile=<profile>
See the cards and who holds them with
  kubectl tessera nodes --tessera-namespace={{ .Values.namespace.name }}
and docs/install.md for the rest.
`

// valuesSchema is the JSON schema of values.yaml: every key typed, none
// unknown (a misspelt key fails the install instead of being ignored).
func valuesSchema(profiles []string) map[string]any {
	obj := func(props map[string]any, required ...string) map[string]any {
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	}
	str := map[string]any{"type": "string"}
	boolean := map[string]any{"type": "boolean"}
	toggle := obj(map[string]any{"enabled": boolean}, "enabled")
	anyObject := map[string]any{"type": "object"}
	anyList := map[string]any{"type": "array", "items": map[string]any{"type": "object"}}
	componentImage := obj(map[string]any{"repository": map[string]any{"type": "string", "minLength": 1}, "tag": str}, "repository")
	scheduling := func(props map[string]any) map[string]any {
		props["image"] = componentImage
		props["nodeSelector"] = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
		props["tolerations"] = anyList
		props["resources"] = anyObject
		return obj(props, "image")
	}
	return map[string]any{
		"$schema": "https://json-schema.org/draft-07/schema#",
		"title":   "Values of Tessera's chart",
		"type":    "object",
		"properties": map[string]any{
			"namespace": obj(map[string]any{
				"name": map[string]any{
					"type": "string", "maxLength": 63,
					"pattern":     "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
					"description": "a DNS label: lower-case letters, digits and '-'",
				},
				"create": boolean,
			}, "name"),
			"image": obj(map[string]any{
				"registry":   str,
				"tag":        str,
				"pullPolicy": map[string]any{"type": "string", "enum": []string{"", "Always", "IfNotPresent", "Never"}},
			}),
			"imagePullSecrets": map[string]any{"type": "array", "items": obj(map[string]any{"name": map[string]any{"type": "string", "minLength": 1}}, "name")},
			"scheduler": scheduling(map[string]any{
				"replicas": map[string]any{"type": "integer", "minimum": 1},
				"profiles": map[string]any{
					"type": "array", "minItems": 1, "uniqueItems": true,
					"items": map[string]any{"type": "string", "enum": profiles},
				},
			}),
			"nodeAgent":      scheduling(map[string]any{}),
			"dra":            toggle,
			"hamiNames":      toggle,
			"gangScheduling": toggle,
			"dynamicMIG":     toggle,
			"monitoring":     toggle,
			"kueue":          toggle,
		},
		"additionalProperties": false,
	}
}
