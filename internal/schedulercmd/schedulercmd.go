// Package schedulercmd assembles Tessera's scheduler: kube-scheduler with the
// GPUShare plugin and its arguments registered. The binary, the integration
// suite and the demo all start the scheduler through it.
package schedulercmd

import (
	"github.com/spf13/cobra"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers GPUShareArgs in kube-scheduler's configuration scheme.
	_ "github.com/tessera-gpu/tessera/pkg/apis/config/scheme"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// Options are the out-of-tree plugin registrations of Tessera's scheduler.
func Options() []app.Option {
	return []app.Option{app.WithPlugin(gpushare.Name, gpushare.New)}
}

// NewCommand returns the scheduler command with every kube-scheduler flag.
func NewCommand() *cobra.Command {
	return app.NewSchedulerCommand(Options()...)
}
