package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/schedulercmd"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// setup runs kube-scheduler's set-up with the given configuration file, as the
// binary does, against an API server that is never contacted.
func setup(t *testing.T, configFile string) (map[string][]string, error) {
	t.Helper()
	tCtx := ktesting.Init(t)
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{"--config=" + configFile, "--master=https://127.0.0.1:1", "--secure-port=0"}); err != nil {
		t.Fatal(err)
	}
	_, sched, err := app.Setup(tCtx, opts, schedulercmd.Options()...)
	if err != nil {
		return nil, err
	}
	binders := map[string][]string{}
	for name, prof := range sched.Profiles {
		for _, p := range prof.ListPlugins().Bind.Enabled {
			binders[name] = append(binders[name], p.Name)
		}
	}
	return binders, nil
}

func TestShippedConfigurationLoads(t *testing.T) {
	binders, err := setup(t, "../../manifests/base/scheduler/scheduler-config.yaml")
	if err != nil {
		t.Fatalf("set-up with the shipped configuration failed: %v", err)
	}
	want := map[string][]string{
		"tessera-binpack":             {gpushare.Name, "DefaultBinder"},
		"tessera-spread":              {gpushare.Name, "DefaultBinder"},
		"tessera-fragmentation-aware": {gpushare.Name, "DefaultBinder"},
	}
	if diff := cmp.Diff(want, binders); diff != "" {
		t.Errorf("bind plugins per profile (-want,+got):\n%s", diff)
	}
}

func TestInvalidArgsStopStartUp(t *testing.T) {
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: tessera-binpack
  plugins: {multiPoint: {enabled: [{name: GPUShare}]}}
  pluginConfig:
  - name: GPUShare
    args: {nodePolicy: Tightest, resourceNames: {gpu: gpus}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := setup(t, config)
	if err == nil {
		t.Fatal("set-up accepted invalid GPUShare args")
	}
	for _, want := range []string{"nodePolicy", "Tightest", "resourceNames.gpu"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
