//go:build tools

// Package tools pins Kueue's manager, which `make test-kueue` builds in this
// module's own dependency graph: Kueue cannot be linked with the Kubernetes
// libraries Tessera uses (docs/queues.md).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
