// Package install renders Tessera's kustomize manifests in Go — with the
// kustomize library `kubectl apply -k` embeds — and applies them to an API
// server with server-side apply, as an operator's `kubectl apply -k
// manifests` would. The demo and the test suite install Tessera this way, so
// every shipped object meets a real API server.
package install

import (
	"fmt"
	"io/fs"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/tessera-gpu/tessera/manifests"
)

// Base is the kustomization an operator applies.
const Base = "."

// Render builds the kustomization at dir of the embedded manifests (Base, or
// an overlay such as "overlays/hami-names") and returns its objects in
// kustomize's output order (namespaces first).
func Render(dir string) ([]*unstructured.Unstructured, error) {
	return RenderFS(manifests.FS, dir)
}

// RenderFS builds the kustomization at dir of fsys.
func RenderFS(fsys fs.FS, dir string) ([]*unstructured.Unstructured, error) {
	nodes, err := RenderNodes(fsys, dir)
	if err != nil {
		return nil, err
	}
	objs := make([]*unstructured.Unstructured, 0, len(nodes))
	for _, n := range nodes {
		raw, err := n.MarshalJSON()
		obj := &unstructured.Unstructured{}
		if err == nil {
			err = obj.UnmarshalJSON(raw)
		}
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s %s: %w", dir, n.GetKind(), n.GetName(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// RenderNodes builds the kustomization at dir of fsys and returns its
// objects as YAML nodes, their fields in the order the files write them.
func RenderNodes(fsys fs.FS, dir string) ([]*kyaml.RNode, error) {
	mem := filesys.MakeFsInMemory()
	const root = "/manifests"
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(root, p), raw)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the manifests: %w", err)
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, path.Join(root, dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return resources.ToRNodeSlice(), nil
}

// Find returns the rendered object of that kind and name (for a generated
// ConfigMap, the name before its content hash).
func Find(objs []*unstructured.Unstructured, kind, name string) (*unstructured.Unstructured, error) {
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		if o.GetName() == name || (kind == "ConfigMap" && strings.HasPrefix(o.GetName(), name+"-")) {
			return o, nil
		}
	}
	return nil, fmt.Errorf("the manifests have no %s %s", kind, name)
}

// SchedulerConfig is the KubeSchedulerConfiguration in the rendered
// scheduler ConfigMap.
func SchedulerConfig(objs []*unstructured.Unstructured) ([]byte, error) {
	cm, err := Find(objs, "ConfigMap", manifests.SchedulerConfigMap)
	if err != nil {
		return nil, err
	}
	data, _, err := unstructured.NestedString(cm.Object, "data", manifests.SchedulerConfigKey)
	if err != nil || data == "" {
		return nil, fmt.Errorf("ConfigMap %s has no %s", cm.GetName(), manifests.SchedulerConfigKey)
	}
	return []byte(data), nil
}
