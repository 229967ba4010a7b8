package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tessera-gpu/tessera/internal/version"
)

func newVersionCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's Tessera version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(g.streams.Out, version.String())
			return err
		},
	}
}
