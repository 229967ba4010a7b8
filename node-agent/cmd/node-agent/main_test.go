package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// This test binary links what the agent links. Had a dependency brought in
// Go's plugin package, the binary would be built with immediate binding and
// fail to start, here as on a node, because NVML's symbols are resolved only
// once the driver's library is loaded.

// TestUnrestrictedAccounts: the agent's own account always, then the
// flag's, each namespace:name.
func TestUnrestrictedAccounts(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		want    []string
		wantErr string
	}{
		{flag: "", want: []string{"tessera-system:tessera-node-agent"}},
		{flag: " gpu-operator:nvidia-dcgm-exporter, mon:exporter ", want: []string{"tessera-system:tessera-node-agent", "gpu-operator:nvidia-dcgm-exporter", "mon:exporter"}},
		{flag: "gpu-operator", wantErr: `"gpu-operator": want namespace:name`},
		{flag: "a:b:c", wantErr: `"a:b:c": want namespace:name`},
		{flag: ":name", wantErr: "want namespace:name"},
	} {
		got, err := unrestrictedAccounts("tessera-system:tessera-node-agent", tc.flag)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.flag, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q: accounts (-want,+got):\n%s", tc.flag, diff)
		}
	}
}

// TestEnforcementOff: an agent without NRI never says its node can take
// GPU pods.
func TestEnforcementOff(t *testing.T) {
	if got := (enforcementOff{}).NotReady(); !strings.Contains(got, "--nri-socket is empty") {
		t.Errorf("NotReady = %q, want the reason named", got)
	}
}
