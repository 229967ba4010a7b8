// Package upgrade installs an earlier commit's manifests on a real API
// server, places GPU pods with that install, upgrades in place to today's
// manifests as `kubectl apply --server-side -k manifests` would, and checks
// that nothing placed was lost and that the upgraded install places and
// refuses as it should. It has a control plane of its own: the earlier
// install must be the first.
package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// earlier is the install being upgraded: the manifests at commit 1a7fa2d
// (before the agent's HTTPS metrics port, the metrics-reader and viewer
// roles, the namespace-following, CDI, high-priority and scheduler-name
// policies, and --resource-names).
const earlier = "testdata/manifests-1a7fa2d"

func TestUpgradeInPlace(t *testing.T) {
	dir := t.TempDir()
	if err := cluster.LogToFile(filepath.Join(dir, "test.log")); err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.Start(t.Logf, cluster.WithManifests(os.DirFS(earlier)))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A GPU node whose agent keeps reporting, and the earlier scheduler
	// configuration placing two shares.
	a, err := cp.AddSimulatedNode(ctx, "gpu-node", cluster.L4, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	go a.Run(agentCtx)
	ns := "team"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := startScheduler(ctx, t, cp, cp.SchedulerConfig, filepath.Join(dir, "earlier"))
	for _, name := range []string{"share-0", "share-1"} {
		createShare(ctx, t, cp, ns, name)
	}
	placed := waitAssigned(ctx, t, cp, ns, "share-0", "share-1")
	before.Stop() // as the Deployment's rollout replaces it

	// The upgrade: today's base applied over the earlier one.
	objs, err := install.Render(install.Base)
	if err != nil {
		t.Fatal(err)
	}
	if err := install.Apply(ctx, cp.Config, objs); err != nil {
		t.Fatalf("applying today's manifests over the earlier ones: %v", err)
	}
	if err := install.WaitEnforced(ctx, cp.Config, gpuinfo.DefaultResourceNames(), time.Minute); err != nil {
		t.Fatalf("today's admission policies after the upgrade: %v", err)
	}

	// Nothing placed is lost: the same nodes and the same assignments.
	got := map[string]string{}
	for name := range placed {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got[name] = p.Spec.NodeName + " " + p.Annotations[gpuinfo.AssignmentAnnotation]
	}
	if diff := cmp.Diff(placed, got); diff != "" {
		t.Errorf("pods after the upgrade (-before,+after):\n%s", diff)
	}

	// Today's scheduler, with today's configuration, counts them: a third
	// share goes beside them and a fourth that no card has room for waits.
	config, err := install.SchedulerConfig(objs)
	if err != nil {
		t.Fatal(err)
	}
	after := startScheduler(ctx, t, cp, config, filepath.Join(dir, "today"))
	defer after.Stop()
	createShare(ctx, t, cp, ns, "share-2")
	waitAssigned(ctx, t, cp, ns, "share-2")
	held := map[string]int64{}
	for _, name := range []string{"share-0", "share-1", "share-2"} {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		assignment, err := gpuinfo.DecodeAssignment(p.Annotations[gpuinfo.AssignmentAnnotation])
		if err != nil {
			t.Fatal(err)
		}
		for _, cards := range assignment.Containers {
			for _, c := range cards {
				held[c.UUID] += c.MemoryMiB
			}
		}
	}
	node, err := cp.Client.CoreV1().Nodes().Get(ctx, "gpu-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inventory, err := gpuinfo.DecodeInventory(node.Annotations[gpuinfo.InventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range inventory.Cards {
		if held[c.UUID] > c.MemoryMiB {
			t.Errorf("card %s holds %d MiB of shares, more than its %d MiB: today's scheduler did not count the earlier placements", c.UUID, held[c.UUID], c.MemoryMiB)
		}
	}
	if len(held) != 2 {
		t.Errorf("the shares are on %d cards, want both (two shares fill one card)", len(held))
	}
}

// shareMiB is each share's memory: two fit on an L4 card, three do not.
const shareMiB = 10240

// createShare creates a pod asking for a share of one card.
func createShare(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name string) {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: "tessera-binpack", Containers: []v1.Container{{
			Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				"tessera.io/gpu-memory": *resource.NewQuantity(shareMiB, resource.DecimalSI),
				"tessera.io/gpu-cores":  *resource.NewQuantity(30, resource.DecimalSI),
			}},
		}}},
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitAssigned waits for the pods to be bound with an assignment and
// returns "node assignment" by pod.
func waitAssigned(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns string, names ...string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" || p.Annotations[gpuinfo.AssignmentAnnotation] == "" {
				return false, nil
			}
			got[name] = p.Spec.NodeName + " " + p.Annotations[gpuinfo.AssignmentAnnotation]
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pods %v not bound with an assignment: %v", names, err)
	}
	return got
}

// startScheduler runs the scheduler with the given configuration as its
// ServiceAccount, writing its files under dir.
func startScheduler(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, config []byte, dir string) *cluster.Scheduler {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig, file := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml")
	if err := cp.WriteSchedulerKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WriteSchedulerConfig(config, kubeconfig, file); err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(ctx, file)
	if err != nil {
		t.Fatal(fmt.Errorf("starting the scheduler: %w", err))
	}
	return s
}
