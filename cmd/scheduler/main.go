// Command scheduler is kube-scheduler with Tessera's GPUShare plugin built in.
// Every kube-scheduler flag works as usual; see manifests/base/scheduler/scheduler-config.yaml
// for the tessera-binpack, tessera-spread and tessera-fragmentation-aware
// profiles.
package main

import (
	"os"

	"k8s.io/component-base/cli"

	"github.com/tessera-gpu/tessera/internal/schedulercmd"
)

func main() {
	os.Exit(cli.Run(schedulercmd.NewCommand()))
}
