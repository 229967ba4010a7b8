package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
)

// TestHAMiNamesEndToEnd runs a pod that asks with HAMi's resource names
// through the scheduler configured by the hami-names overlay and through
// the node agent's NRI hook configured from the same file: the container
// gets its card and its limits.
func TestHAMiNamesEndToEnd(t *testing.T) {
	e := newEnv(t)
	objs, err := install.Render("overlays/hami-names")
	if err != nil {
		t.Fatal(err)
	}
	config, err := install.SchedulerConfig(objs)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "hami.yaml")
	if err := cluster.WriteSchedulerConfig(config, e.kubeconfig, file); err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(e.tCtx, file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	node := e.node("hami", cluster.A100, 1, nil)
	e.create(e.podSpec("model", "tessera-binpack", map[string]int64{"nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 30}))
	pod := e.waitBound(30*time.Second, "model")["model"]

	// The agent, as the DaemonSet starts it: names from the same file.
	names, err := configv1.ResourceNamesIn(config)
	if err != nil {
		t.Fatal(err)
	}
	enforcement := enforce.DefaultConfig()
	enforcement.Names = names
	enforcement.Paths.HostCacheDir = t.TempDir()
	plugin := &nri.Plugin{Node: node, Enforce: enforcement, PodWait: time.Second}
	backend, err := discovery.NewSimulated(node, "1x"+string(cluster.A100))
	if err != nil {
		t.Fatal(err)
	}
	cards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	plugin.Update(cards)
	ctx, cancel := context.WithTimeout(e.tCtx, 30*time.Second)
	defer cancel()
	pods, err := nri.WatchPodsOnNode(ctx, e.agentClient(node), node)
	if err != nil {
		t.Fatal(err)
	}
	plugin.SetPods(pods)
	adj, _, err := plugin.CreateContainer(ctx, &api.PodSandbox{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)}, &api.Container{Id: "ctr-main", Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range adj.GetEnv() {
		got[kv.Key] = kv.Value
	}
	uuid := assignment(t, pod).Containers["main"][0].UUID
	for k, want := range map[string]string{"NVIDIA_VISIBLE_DEVICES": uuid, "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT_0": "30"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
}
