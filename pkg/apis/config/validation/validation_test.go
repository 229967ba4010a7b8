package validation_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
	"github.com/tessera-gpu/tessera/pkg/apis/config/validation"
)

func defaulted(t *testing.T) *config.GPUShareArgs {
	t.Helper()
	v := &configv1.GPUShareArgs{}
	configv1.SetDefaults_GPUShareArgs(v)
	out := &config.GPUShareArgs{}
	if err := configv1.Convert_v1_GPUShareArgs_To_config_GPUShareArgs(v, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDefaultsAreValid(t *testing.T) {
	a := defaulted(t)
	if err := validation.ValidateGPUShareArgs(field.NewPath("args"), a); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if a.NodePolicy != config.PolicyBinpack || a.GPUPolicy != config.PolicyBinpack ||
		a.ResourceNames.GPU != "tessera.io/gpu" || a.AgentHeartbeatTimeout.Duration != 40*time.Second || a.AgentNamespace != "tessera-system" {
		t.Errorf("unexpected defaults: %+v", a)
	}
}

func TestValidateGPUShareArgs(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*config.GPUShareArgs)
		wantErr string
	}{
		{"spread", func(a *config.GPUShareArgs) { a.NodePolicy, a.GPUPolicy = config.PolicySpread, config.PolicySpread }, ""},
		{"fragmentation-aware", func(a *config.GPUShareArgs) {
			a.NodePolicy, a.GPUPolicy = config.PolicyFragmentationAware, config.PolicyFragmentationAware
		}, ""},
		{"heartbeat check off", func(a *config.GPUShareArgs) { a.AgentHeartbeatTimeout = metav1.Duration{} }, ""},
		{"unknown node policy", func(a *config.GPUShareArgs) { a.NodePolicy = "Tightest" }, `args.nodePolicy: Unsupported value: "Tightest"`},
		{"unknown gpu policy", func(a *config.GPUShareArgs) { a.GPUPolicy = "" }, `args.gpuPolicy: Unsupported value: ""`},
		{"missing resource name", func(a *config.GPUShareArgs) { a.ResourceNames.Cores = "" }, "args.resourceNames.cores: Required value"},
		{"not an extended resource", func(a *config.GPUShareArgs) { a.ResourceNames.GPU = "gpu" }, "args.resourceNames.gpu: Invalid value"},
		{"duplicate resource name", func(a *config.GPUShareArgs) { a.ResourceNames.Memory = a.ResourceNames.GPU }, "args.resourceNames.memory: Duplicate value"},
		{"negative timeout", func(a *config.GPUShareArgs) { a.AgentHeartbeatTimeout = metav1.Duration{Duration: -time.Second} }, "args.agentHeartbeatTimeout: Invalid value"},
		{"bad namespace", func(a *config.GPUShareArgs) { a.AgentNamespace = "Tessera_System" }, "args.agentNamespace: Invalid value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := defaulted(t)
			tc.mutate(a)
			err := validation.ValidateGPUShareArgs(field.NewPath("args"), a)
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
