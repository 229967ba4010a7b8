package resize

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	tt "github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// TestDecide: right-sizing's rule, against figures worked out by hand
// (margin 25 % of the peak, at least 256 MiB, rounded up to 256 MiB; a
// shrink must free 512 MiB; a restore at 90 % of a shrunken share).
func TestDecide(t *testing.T) {
	const quiet = 30 * time.Minute
	use := func(now, peak int64, window time.Duration) gpuinfo.ContainerUse {
		return gpuinfo.ContainerUse{UseMiB: now, PeakMiB: peak, WindowSeconds: int64(window / time.Second)}
	}
	for _, tc := range []struct {
		name           string
		share, request int64
		use            gpuinfo.ContainerUse
		action         string
		target         int64
	}{
		{"quiet notebook shrinks to peak plus a quarter", 16000, 16000, use(900, 1500, quiet), actionShrink, 2048},
		{"margin at least 256 MiB", 16000, 16000, use(0, 100, quiet), actionShrink, 512},
		{"nothing used at all", 16000, 16000, use(0, 0, quiet), actionShrink, 256},
		{"window shorter than the quiet period", 16000, 16000, use(900, 1500, quiet-time.Second), "", 0},
		{"window longer counts", 16000, 16000, use(900, 1500, 2*quiet), actionShrink, 2048},
		{"shrunk already: nothing more to free", 2048, 16000, use(900, 1500, quiet), "", 0},
		{"frees exactly 512 MiB", 2560, 16000, use(900, 1500, quiet), actionShrink, 2048},
		{"frees less than 512 MiB", 2559, 16000, use(900, 1500, quiet), "", 0},
		{"busy at its request: neither", 16000, 16000, use(15200, 15200, quiet), "", 0},
		{"use near the shrunken limit restores", 2048, 16000, use(1844, 1844, time.Minute), actionRestore, 16000},
		{"just below 90 % stays", 2048, 16000, use(1843, 1843, quiet), "", 0},
		{"exactly 90 % restores", 2000, 16000, use(1800, 1800, time.Minute), actionRestore, 16000},
		{"restore wins over a shrink", 8192, 16000, use(7400, 7400, quiet), actionRestore, 16000},
		{"peak plus margin above the request: no shrink", 4096, 4096, use(3500, 3500, quiet), "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			action, target := decide(tc.share, tc.request, tc.use, quiet)
			if action != tc.action || target != tc.target {
				t.Errorf("decide(share %d, request %d, %+v) = %q %d; want %q %d", tc.share, tc.request, tc.use, action, target, tc.action, tc.target)
			}
		})
	}
}

// TestDue: a shrink waits a quiet period after the container's last
// resize was decided (a restore included, so a woken notebook is not shrunk
// again at once); a restore is asked again only restoreRetry after the last.
func TestDue(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	c := &Controller{now: func() time.Time { return now }}
	c.rs.restored = map[string]time.Time{"uid/main": now.Add(-5 * time.Second), "uid/old": now.Add(-restoreRetry)}
	for _, tc := range []struct {
		name   string
		action string
		key    string
		last   history
		want   bool
	}{
		{"shrink, never resized", actionShrink, "uid/main", history{}, true},
		{"shrink, resized 30 s ago", actionShrink, "uid/main", history{decidedAt: now.Add(-30 * time.Second)}, false},
		{"shrink, resized a quiet period ago", actionShrink, "uid/main", history{decidedAt: now.Add(-time.Minute)}, true},
		{"restore, asked 5 s ago", actionRestore, "uid/main", history{}, false},
		{"restore, asked restoreRetry ago", actionRestore, "uid/old", history{}, true},
		{"restore, never asked", actionRestore, "uid/other", history{decidedAt: now}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.due(tc.action, tc.key, tc.last, time.Minute); got != tc.want {
				t.Errorf("due = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMetricsDocumented: the controller's metrics are those
// docs/observability.md lists.
func TestMetricsDocumented(t *testing.T) {
	got := []string{rightSizeDecisions.Name}
	if diff := cmp.Diff(tt.DocumentedMetrics(t, "Resize controller metrics"), got); diff != "" {
		t.Errorf("exported metrics (-documented,+exported):\n%s", diff)
	}
}
