//go:build tools

// Package tools pins the programs `make e2e-node` builds: containerd, its
// runc shim, ctr and runc. They stay out of the product's go.mod.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
)
