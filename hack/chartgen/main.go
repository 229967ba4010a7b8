// Command chartgen writes charts/tessera from the kustomize manifests
// (`make chart`); see internal/chartgen.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tessera-gpu/tessera/internal/chartgen"
	"github.com/tessera-gpu/tessera/manifests"
)

func main() {
	out := flag.String("o", "charts/tessera", "the chart's directory (its generated files are replaced)")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
}

// write replaces the chart's templates with freshly generated ones and
// writes its other files, leaving files it does not generate (README.md).
func write(out string) error {
	files, err := chartgen.Generate(manifests.FS)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(out, "templates")); err != nil {
		return err
	}
	for name, content := range files {
		p := filepath.Join(out, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("chartgen: wrote %d files to %s\n", len(files), out)
	return nil
}
