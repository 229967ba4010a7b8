package cluster

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/spf13/pflag"
	"k8s.io/component-base/configz"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/schedulercmd"
)

// configzName is the /configz entry kube-scheduler registers in Run.
const configzName = "componentconfig"

// Scheduler is Tessera's scheduler running in this process.
type Scheduler struct {
	cancel context.CancelFunc
	done   chan error
	stop   sync.Once
}

// WriteSchedulerConfig writes the scheduler configuration raw to dst with
// its client pointed at kubeconfig and kube-scheduler's client rate limit
// raised (as upstream's scheduler_perf does), so that the limiter is not what
// a test measures. Everything else is as given (ControlPlane.SchedulerConfig:
// the installed one).
func WriteSchedulerConfig(raw []byte, kubeconfig, dst string) error {
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("scheduler configuration: %w", err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 5000, "burst": 5000}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, out, 0o600)
}

// StartScheduler runs the scheduler command's set-up and run in this process,
// as the binary does, with the given configuration file and extra
// kube-scheduler flags. Leader election is off: kube-scheduler exits the
// process when a leader stops, so replicas with leader election must run as
// processes of their own (see schedulercmd.NewCommand).
func StartScheduler(ctx context.Context, configFile string, flags ...string) (*Scheduler, error) {
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("tessera-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	args := append([]string{"--config=" + configFile, "--secure-port=0", "--leader-elect=false"}, flags...)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	cc, sched, err := app.Setup(ctx, opts, schedulercmd.Options()...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("setting up the scheduler: %w", err)
	}
	s := &Scheduler{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := app.Run(ctx, cc, sched)
		if ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Scheduler stopped on its own")
		}
		s.done <- err
	}()
	return s, nil
}

// Stop stops the scheduler and waits for it to return. It unregisters the
// scheduler's /configz entry, which is global to the process, so that another
// scheduler can start after it. Stopping twice is harmless.
func (s *Scheduler) Stop() {
	s.stop.Do(func() {
		s.cancel()
		<-s.done
		configz.Delete(configzName)
	})
}
