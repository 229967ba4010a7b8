// Command tessera-gpu-check checks the node agent against a real card:
// NVML's initialisation, one discovery scan and the inventory the agent
// would publish, its validation, scan times, per-process memory and the XID
// watch (node-agent/gpucheck). It reads only. It writes report.json and
// summary.txt into --out (the device tool's $OUT) and exits 1 when a check
// fails. docs/node-agent.md says how to run it on a lent machine.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/node-agent/discovery/nvidia"
	"github.com/tessera-gpu/tessera/node-agent/gpucheck"
)

func main() {
	out := flag.String("out", os.Getenv("OUT"), "folder for report.json and summary.txt (default $OUT, else the current folder)")
	scans := flag.Int("scans", gpucheck.DefaultOptions.Scans, "discovery scans to time")
	xidWait := flag.Duration("xid-wait", gpucheck.DefaultOptions.XIDWait, "how long to listen for XID events")
	flag.Parse()
	if *out == "" {
		*out = "."
	}
	report := check(*scans, *xidWait)
	if err := write(*out, report); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-gpu-check:", err)
		os.Exit(2)
	}
	fmt.Print(report.Summary())
	if !report.Passed() {
		os.Exit(1)
	}
}

// check initialises NVML as the agent does and runs the checks.
func check(scans int, xidWait time.Duration) *gpucheck.Report {
	n, err := nvidia.New(nvml.New())
	if err != nil {
		return &gpucheck.Report{Backend: "nvml", XIDs: []gpucheck.XID{},
			Checks: []gpucheck.Check{{Name: "nvml-init", Detail: err.Error()}}}
	}
	defer n.Close()
	return gpucheck.Run(context.Background(), n, gpucheck.Options{Scans: scans, XIDWait: xidWait})
}

// write puts the report and its summary into dir.
func write(dir string, r *gpucheck.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(raw, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(r.Summary()), 0o644)
}
