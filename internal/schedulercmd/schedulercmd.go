// Package schedulercmd assembles Tessera's scheduler: kube-scheduler with the
// GPUShare and GPUSharePreemption plugins and their arguments registered.
// The binary, the integration suite and the demo all start the scheduler
// through it.
package schedulercmd

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/internal/version"
	// Registers GPUShareArgs in kube-scheduler's configuration scheme.
	_ "github.com/tessera-gpu/tessera/pkg/apis/config/scheme"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// Options are the out-of-tree plugin registrations of Tessera's scheduler.
func Options() []app.Option {
	return []app.Option{
		app.WithPlugin(gpushare.Name, gpushare.New),
		app.WithPlugin(gpushare.PreemptionName, gpushare.NewPreemption),
	}
}

// NewCommand returns the scheduler command with every kube-scheduler flag.
// --version prints Tessera's version before kube-scheduler's, and the
// scheduler logs it as it starts.
func NewCommand() *cobra.Command {
	cmd := app.NewSchedulerCommand(Options()...)
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if f := c.Flags().Lookup("version"); f != nil && f.Changed {
			fmt.Fprintln(c.OutOrStdout(), version.String())
		} else {
			klog.InfoS("Tessera scheduler", "version", version.Version, "revision", version.Revision())
		}
		return run(c, args)
	}
	return cmd
}
