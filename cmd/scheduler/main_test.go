package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/schedulercmd"
	"github.com/tessera-gpu/tessera/pkg/plugins/gpushare"
)

// setup runs kube-scheduler's set-up with the given configuration file, as the
// binary does, against an API server that is never contacted, and returns
// each profile's plugins.
func setup(t *testing.T, configFile string) (map[string]*config.Plugins, error) {
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
	plugins := map[string]*config.Plugins{}
	for name, prof := range sched.Profiles {
		plugins[name] = prof.ListPlugins()
	}
	return plugins, nil
}

// names lists the plugins of one extension point.
func names(set config.PluginSet) []string {
	var out []string
	for _, p := range set.Enabled {
		out = append(out, p.Name)
	}
	return out
}

func TestShippedConfigurationLoads(t *testing.T) {
	profiles, err := setup(t, "../../manifests/base/scheduler/scheduler-config.yaml")
	if err != nil {
		t.Fatalf("set-up with the shipped configuration failed: %v", err)
	}
	want := map[string][]string{
		"tessera-binpack":             {gpushare.Name, "DefaultBinder"},
		"tessera-spread":              {gpushare.Name, "DefaultBinder"},
		"tessera-fragmentation-aware": {gpushare.Name, "DefaultBinder"},
	}
	binders := map[string][]string{}
	for name, plugins := range profiles {
		binders[name] = names(plugins.Bind)
		// GPUShare explains first; GPUSharePreemption, in DefaultPreemption's
		// place, preempts.
		if diff := cmp.Diff([]string{gpushare.Name, gpushare.PreemptionName}, names(plugins.PostFilter)); diff != "" {
			t.Errorf("profile %s: PostFilter plugins (-want,+got):\n%s", name, diff)
		}
		// GPUShare's PreFilter narrows what NodeResourcesFit's Filter checks,
		// so it must run after NodeResourcesFit's.
		preFilter := names(plugins.PreFilter)
		if fit, share := slices.Index(preFilter, "NodeResourcesFit"), slices.Index(preFilter, gpushare.Name); fit < 0 || share < fit {
			t.Errorf("profile %s: PreFilter order %v; want NodeResourcesFit before %s", name, preFilter, gpushare.Name)
		}
	}
	if diff := cmp.Diff(want, binders); diff != "" {
		t.Errorf("bind plugins per profile (-want,+got):\n%s", diff)
	}
}

// TestInvalidArgsStopStartUp: invalid args of GPUShare, and of
// GPUSharePreemption (DefaultPreemptionArgs given under its name, decoded
// and validated at start-up), stop the scheduler with the fields named.
func TestInvalidArgsStopStartUp(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		want    []string
	}{
		{name: "GPUShare", want: []string{"nodePolicy", "Tightest", "resourceNames.gpu"}, profile: `
  plugins: {multiPoint: {enabled: [{name: GPUShare}]}}
  pluginConfig:
  - name: GPUShare
    args: {nodePolicy: Tightest, resourceNames: {gpu: gpus}}
`},
		{name: "GPUSharePreemption", want: []string{"minCandidateNodesPercentage"}, profile: `
  plugins:
    multiPoint: {enabled: [{name: GPUShare}, {name: GPUSharePreemption}], disabled: [{name: DefaultPreemption}]}
  pluginConfig:
  - name: GPUSharePreemption
    args: {minCandidateNodesPercentage: 200}
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			config := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(config, []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: tessera-binpack`+tc.profile), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := setup(t, config)
			if err == nil {
				t.Fatalf("set-up accepted invalid %s args", tc.name)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}
