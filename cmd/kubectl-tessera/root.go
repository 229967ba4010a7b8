package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/fleet"
)

// Output formats of the -o flag.
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// requestTimeout bounds each command's calls to the API server.
const requestTimeout = 30 * time.Second

// isTerminal reports whether w is a terminal; tests replace it to draw bars.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// now is the clock the agents' heartbeats are judged by; tests may replace it.
var now = time.Now

// globals are the options every subcommand shares.
type globals struct {
	config  *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	output  string
	// tesseraNamespace is where Tessera is installed: the agents, their
	// Leases and the scheduler's Deployment.
	tesseraNamespace string
}

// newRootCommand returns `kubectl tessera` with its subcommands, writing to
// streams.
func newRootCommand(streams genericiooptions.IOStreams) *cobra.Command {
	g := &globals{config: genericclioptions.NewConfigFlags(true), streams: streams}
	cmd := &cobra.Command{
		Use:   "kubectl-tessera",
		Short: "Show Tessera's GPU placements: cards, pods and why pods wait",
		Long: `kubectl tessera shows what Tessera's scheduler sees: every GPU node's cards
with the memory and compute allocated and the pods holding them, why a pod
is or is not placed, and what the containers on GPUs were given and use.`,
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl tessera",
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.SetIn(streams.In)
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)
	g.config.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&g.output, "output", "o", "", "Output format: wide, json or yaml (default: a table)")
	cmd.PersistentFlags().StringVar(&g.tesseraNamespace, "tessera-namespace", envOr(namespaceEnv, fleet.AgentNamespace),
		"Namespace Tessera is installed in (the Helm chart's namespace.name; default from $"+namespaceEnv+")")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		switch g.output {
		case outputTable, outputWide, outputJSON, outputYAML:
			return nil
		}
		return fmt.Errorf("unknown output format %q: use wide, json or yaml", g.output)
	}
	cmd.AddCommand(newNodesCommand(g), newPodCommand(g), newResizeCommand(g), newTopCommand(g), newVersionCommand(g))
	for _, sub := range cmd.Commands() {
		if run := sub.RunE; run != nil {
			sub.RunE = func(c *cobra.Command, args []string) error { return explainForbidden(run(c, args), g.tesseraNamespace) }
		}
	}
	return cmd
}

// namespaceEnv, where set, is the default of --tessera-namespace.
const namespaceEnv = "TESSERA_NAMESPACE"

// envOr returns the environment variable key, or def where it is unset.
func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// explainForbidden adds to an RBAC refusal which roles grant what the
// plugin reads in tesseraNamespace.
func explainForbidden(err error, tesseraNamespace string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return fmt.Errorf("%w\nkubectl tessera reads nodes, pods, resource slices and claims cluster-wide and the agents' Leases in %s: "+
		"ask for the ClusterRole tessera-viewer and the Role tessera-viewer in %s (and the Role tessera-top there for top's memory in use)",
		err, tesseraNamespace, tesseraNamespace)
}

// client returns a clientset for the kubeconfig, context and server flags.
func (g *globals) client() (kubernetes.Interface, error) {
	cfg, err := g.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = requestTimeout
	return kubernetes.NewForConfig(cfg)
}

// clientIn returns a clientset and the namespace of the -n flag (or the
// kubeconfig context's).
func (g *globals) clientIn() (kubernetes.Interface, string, error) {
	client, err := g.client()
	if err != nil {
		return nil, "", err
	}
	ns, err := g.namespace()
	return client, ns, err
}

// namespace returns the -n flag, or the kubeconfig context's namespace.
func (g *globals) namespace() (string, error) {
	ns, _, err := g.config.ToRawKubeConfigLoader().Namespace()
	return ns, err
}

// bars reports whether tables get usage bars: only on a terminal.
func (g *globals) bars() bool {
	return (g.output == outputTable || g.output == outputWide) && isTerminal(g.streams.Out)
}
