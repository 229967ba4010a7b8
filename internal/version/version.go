// Package version is Tessera's own version, apart from the Kubernetes
// version kube-scheduler reports: kube-scheduler resolves its feature gates
// by that one, so Tessera's is never stamped into it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is Tessera's release, set when building:
//
//	-ldflags "-X github.com/tessera-gpu/tessera/internal/version.Version=v0.1.0"
//
// (make build and make release do). A plain go build says v0.0.0-dev.
var Version = "v0.0.0-dev"

// Revision is the VCS revision Go recorded in the binary, with "-dirty" when
// the tree had uncommitted changes, or "unknown" (tests, builds outside a
// checkout).
func Revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	revision, dirty := "unknown", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return revision
}

// String is the version line each binary prints and logs.
func String() string {
	return fmt.Sprintf("Tessera %s (revision %s, %s)", Version, Revision(), runtime.Version())
}
