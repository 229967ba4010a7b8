// Package helm renders charts/tessera with Helm's own library and checks it
// against the kustomize manifests it is generated from.
package helm
