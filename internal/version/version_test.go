package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	old := Version
	defer func() { Version = old }()
	Version = "v9.8.7"
	got := String()
	for _, want := range []string{"Tessera v9.8.7", "revision " + Revision(), runtime.Version()} {
		if !strings.Contains(got, want) {
			t.Errorf("String() = %q, want it to contain %q", got, want)
		}
	}
}
