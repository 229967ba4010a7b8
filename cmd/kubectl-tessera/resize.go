package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/pkg/apis/resize/v1alpha1"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// resizeWait bounds --wait: the controller waits two minutes for the node
// agent.
const resizeWait = 3 * time.Minute

func newResizeCommand(g *globals) *cobra.Command {
	var container, memory string
	var cores int64
	var noWait bool
	cmd := &cobra.Command{
		Use:   "resize POD --memory SIZE [--cores PERCENT] [-c CONTAINER]",
		Short: "Change a running container's GPU share without restarting it",
		Long: `Ask for a new GPU share for a running container, on the cards it holds: a
GPUShareResize in the pod's namespace, which Tessera applies or refuses
(docs/resize.md). The share cannot exceed what the container asks for.
Running processes see a new memory limit at once; a new compute share
applies to processes started after it.`,
		Example: `  kubectl tessera resize notebook --memory 4Gi -n team-a
  kubectl tessera resize inference -c server --memory 16Gi --cores 40`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if memory == "" && !cmd.Flags().Changed("cores") {
				return errors.New("give --memory, --cores or both")
			}
			spec := map[string]any{"podName": args[0]}
			if memory != "" {
				q, err := resource.ParseQuantity(memory)
				if err != nil {
					return fmt.Errorf("--memory %q: %w", memory, err)
				}
				spec["memory"] = q.String()
			}
			if cmd.Flags().Changed("cores") {
				if cores < 1 || cores > 99 {
					return fmt.Errorf("--cores %d: give a percentage from 1 to 99", cores)
				}
				spec["cores"] = cores
			}
			return runResize(cmd.Context(), g, args[0], container, spec, !noWait)
		},
	}
	cmd.Flags().StringVarP(&container, "container", "c", "", "The container (default: the pod's only container holding a GPU share)")
	cmd.Flags().StringVar(&memory, "memory", "", "The new memory share on each of the container's cards, e.g. 16Gi")
	cmd.Flags().Int64Var(&cores, "cores", 0, "The new compute share of each card, in percent (1-99)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "Return once the resize is created, without waiting for its outcome")
	return cmd
}

func runResize(ctx context.Context, g *globals, pod, container string, spec map[string]any, waitForIt bool) error {
	client, ns, err := g.clientIn()
	if err != nil {
		return err
	}
	cfg, err := g.config.ToRESTConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if container == "" {
		p, err := client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("getting pod %s/%s: %w", ns, pod, err)
		}
		if container, err = sharedContainer(p.Annotations[gpuinfo.AssignmentAnnotation]); err != nil {
			return fmt.Errorf("pod %s/%s: %w", ns, pod, err)
		}
	}
	spec["container"] = container
	resizes := dyn.Resource(v1alpha1.Resource).Namespace(ns)
	created, err := resizes.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.Resource.GroupVersion().String(),
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"generateName": pod + "-"},
		"spec":       spec,
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the GPUShareResize: %w", err)
	}
	fmt.Fprintf(g.streams.Out, "gpushareresize.tessera.io/%s created\n", created.GetName())
	if !waitForIt {
		return nil
	}
	var r *v1alpha1.GPUShareResize
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, resizeWait, true, func(ctx context.Context) (bool, error) {
		u, err := resizes.Get(ctx, created.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r = &v1alpha1.GPUShareResize{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err != nil {
			return false, err
		}
		return r.Decided(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for GPUShareResize %s: %w", created.GetName(), err)
	}
	if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionRefused); c != nil && c.Status == metav1.ConditionTrue {
		return fmt.Errorf("GPUShareResize %s refused (%s): %s", r.Name, c.Reason, c.Message)
	}
	c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionApplied)
	fmt.Fprintf(g.streams.Out, "applied: %s\n", c.Message)
	return nil
}

// sharedContainer is the only container holding shares in the assignment.
func sharedContainer(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("it holds no cards (not placed by Tessera, or not placed yet)")
	}
	a, err := gpuinfo.DecodeAssignment(raw)
	if err != nil {
		return "", err
	}
	var shared []string
	for name, cards := range a.Containers {
		if len(cards) > 0 && cards[0].Cores < gpuinfo.FullCores && cards[0].MIG == nil {
			shared = append(shared, name)
		}
	}
	sort.Strings(shared)
	switch len(shared) {
	case 1:
		return shared[0], nil
	case 0:
		return "", errors.New("no container holds a share of a card (whole cards and MIG slices are not resized)")
	}
	return "", fmt.Errorf("containers %s hold shares: name one with -c", strings.Join(shared, ", "))
}

// podResizes lists the pod's GPUShareResizes, oldest first (by the second;
// by name within one), as lines for
// `kubectl tessera pod`.
func podResizes(ctx context.Context, g *globals, ns, pod string) ([]string, error) {
	cfg, err := g.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	list, err := dyn.Resource(v1alpha1.Resource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var found []*v1alpha1.GPUShareResize
	for i := range list.Items {
		r := &v1alpha1.GPUShareResize{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, r) == nil && r.Spec.PodName == pod {
			found = append(found, r)
		}
	}
	slices.SortFunc(found, func(a, b *v1alpha1.GPUShareResize) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var lines []string
	for _, r := range found {
		name := r.Name
		if why := r.Labels[v1alpha1.RightSizeLabel]; why != "" {
			name += " (right-sizing: " + why + ")"
		}
		lines = append(lines, fmt.Sprintf("%s: container %s to %s: %s", name, r.Spec.Container, askedShare(r), outcome(r)))
	}
	return lines, nil
}

// askedShare is what a resize asks: "4Gi, 20% compute".
func askedShare(r *v1alpha1.GPUShareResize) string {
	var parts []string
	if r.Spec.Memory != nil {
		parts = append(parts, r.Spec.Memory.String())
	}
	if r.Spec.Cores != nil {
		parts = append(parts, fmt.Sprintf("%d%% compute", *r.Spec.Cores))
	}
	return strings.Join(parts, ", ")
}

// outcome is where a resize stands.
func outcome(r *v1alpha1.GPUShareResize) string {
	for _, kind := range []string{v1alpha1.ConditionApplied, v1alpha1.ConditionRefused, v1alpha1.ConditionPending} {
		if c := meta.FindStatusCondition(r.Status.Conditions, kind); c != nil && c.Status == metav1.ConditionTrue {
			return kind + " (" + c.Reason + ": " + c.Message + ")"
		}
	}
	return "not taken up yet"
}
