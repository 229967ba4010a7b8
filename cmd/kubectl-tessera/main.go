// Command kubectl-tessera is a kubectl plugin, `kubectl tessera`, that shows
// Tessera's GPU sharing from the Kubernetes API: the cards of every GPU node
// and who holds them (nodes), why a pod is or is not placed (pod), and what
// the containers on GPUs were given and use (top). Usage is computed with
// the scheduler's own allocator, so the answers are the scheduler's.
package main

import (
	"fmt"
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

func main() {
	cmd := newRootCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
