package schedulercmd

// What kube-scheduler's own main registers, here so that the binary, the
// integration suite and the demo all have it: the JSON log format
// (--logging-format=json), client-go's metrics (leader election's
// leader_election_master_status, which the alert TesseraSchedulerNoLeader
// reads, among them) and the build's version metric.
import (
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)
