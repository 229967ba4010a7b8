// Command scheduler is kube-scheduler with Tessera's GPUShare plugin built in.
// Every kube-scheduler flag works as usual; see config/scheduler-config.yaml
// for the tessera-binpack and tessera-spread profiles.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "github.com/tessera-gpu/tessera/pkg/apis/config/scheme"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

func main() {
	command := app.NewSchedulerCommand(app.WithPlugin(gpushare.Name, gpushare.New))
	os.Exit(cli.Run(command))
}
