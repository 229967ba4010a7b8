package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tessera-gpu/tessera/pkg/linksim"
)

// linksTableFile is --links' table.
const linksTableFile = "links.md"

// linksPods is how many pods arrive in each --links simulation.
const linksPods = 4000

// runLinks runs the topology churn simulation (pkg/linksim) for every policy
// and seed, and writes its table and plot.
func runLinks(o options, out io.Writer) error {
	seeds, err := parseSeeds(o.seeds)
	if err != nil {
		return err
	}
	var results []*linksim.Result
	for _, p := range linksim.Policies {
		for _, seed := range seeds {
			r, err := linksim.Run(linksim.Config{Seed: seed, Fleet: linksim.DefaultFleet, Mix: linksim.DefaultMix, Pods: linksPods, Load: o.load}, p)
			if err != nil {
				return err
			}
			results = append(results, r)
		}
	}
	summaries := linksim.Summarize(results, linksim.Policies)
	table := fmt.Sprintf("Topology churn: %d pods of 1/2/4/8 whole cards (weights 0.5/0.25/0.15/0.10) at offered load %.2f on 4 NVSwitch nodes, 8 of two NVLink quads and 8 of four PCIe cards; seeds %s.\n\n", linksPods, o.load, o.seeds) +
		linksim.Table(summaries)
	if err := os.WriteFile(filepath.Join(o.out, linksTableFile), []byte(table), 0o644); err != nil {
		return err
	}
	plotPath := filepath.Join(o.out, "links."+o.plotFormat)
	if err := linksim.Plot(plotPath, fmt.Sprintf("multi-card pods on NVLink under churn (load %.2f, %d seeds)", o.load, len(seeds)), summaries); err != nil {
		return err
	}
	fmt.Fprint(out, table)
	fmt.Fprintln(out, "\nwrote", filepath.Join(o.out, linksTableFile), "and", plotPath)
	return nil
}
