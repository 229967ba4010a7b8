package schedulercmd

// What kube-scheduler's own main registers, here so that the binary, the
// integration suite and the demo all have it: the JSON log format
// (--logging-format=json), client-go's metrics (leader election's
// leader_election_master_status, which the alert TesseraSchedulerNoLeader
// reads, among them) and the build's version metric.
import (
	"runtime"

	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	"github.com/tessera-gpu/tessera/internal/version"
)

// buildInfo is Tessera's version beside kube-scheduler's
// kubernetes_build_info: 1, labelled with the version and the revision.
var buildInfo = metrics.NewGaugeVec(&metrics.GaugeOpts{
	Name:           "tessera_build_info",
	Help:           "1, labelled with the Tessera version, VCS revision and Go version of this binary.",
	StabilityLevel: metrics.ALPHA,
}, []string{"version", "revision", "go_version"})

func init() {
	legacyregistry.MustRegister(buildInfo)
	buildInfo.WithLabelValues(version.Version, version.Revision(), runtime.Version()).Set(1)
}
