// Package config embeds the shipped scheduler configuration, so tools that
// build the scheduler in-process (the trace simulator, benchmarks) use exactly
// the profiles an operator deploys.
package config

import _ "embed"

// SchedulerConfig is scheduler-config.yaml as shipped.
//
//go:embed scheduler-config.yaml
var SchedulerConfig []byte
