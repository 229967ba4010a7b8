package fleet

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

const inventory = `{"version":1,"cards":[
{"index":1,"uuid":"GPU-b","model":"Tesla T4","memoryMiB":15360,"cores":100,"numaNode":0,"healthy":true},
{"index":0,"uuid":"GPU-a","model":"Tesla T4","memoryMiB":15360,"cores":100,"numaNode":0,"healthy":true}]}`

func node(name, inventory string) v1.Node {
	n := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if inventory != "" {
		n.Annotations = map[string]string{gpuinfo.InventoryAnnotation: inventory}
	}
	return n
}

func pod(name, node, assignment string, phase v1.PodPhase, init ...string) v1.Pod {
	p := v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{gpuinfo.AssignmentAnnotation: assignment}},
		Spec:       v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "main"}}},
		Status:     v1.PodStatus{Phase: phase},
	}
	for _, c := range init {
		p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: c})
	}
	return p
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nodes        []v1.Node
		pods         []v1.Pod
		wantNodes    []string
		wantUsed     []allocator.Usage // of node "n"
		wantHolders  [][]PodRef        // of node "n"
		wantProblems []string
	}{{
		name:        "cards sorted by index, no pods",
		nodes:       []v1.Node{node("n", inventory), node("cpu", "")},
		wantNodes:   []string{"n"},
		wantUsed:    []allocator.Usage{{}, {}},
		wantHolders: [][]PodRef{nil, nil},
	}, {
		name:  "running pods charged, finished and unbound not",
		nodes: []v1.Node{node("n", inventory)},
		pods: []v1.Pod{
			pod("a", "n", `{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-a","memoryMiB":4096,"cores":30}]}}`, v1.PodRunning),
			pod("b", "n", `{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-a","memoryMiB":1024,"cores":0}]}}`, v1.PodPending),
			pod("done", "n", `{"version":1,"containers":{"main":[{"index":1,"uuid":"GPU-b","memoryMiB":1024,"cores":10}]}}`, v1.PodSucceeded),
			pod("unbound", "", `{"version":1,"containers":{"main":[{"index":1,"uuid":"GPU-b","memoryMiB":1024,"cores":10}]}}`, v1.PodPending),
		},
		wantNodes:   []string{"n"},
		wantUsed:    []allocator.Usage{{MemoryMiB: 5120, Cores: 30}, {}},
		wantHolders: [][]PodRef{{{"ns", "a"}, {"ns", "b"}}, nil},
	}, {
		name:  "init container's card reused, exclusive entry takes the card",
		nodes: []v1.Node{node("n", inventory)},
		pods: []v1.Pod{
			pod("i", "n", `{"version":1,"containers":{"init":[{"index":0,"uuid":"GPU-a","memoryMiB":8192,"cores":10}],"main":[{"index":0,"uuid":"GPU-a","memoryMiB":4096,"cores":20}]}}`, v1.PodRunning, "init"),
			pod("x", "n", `{"version":1,"containers":{"main":[{"index":1,"uuid":"GPU-b","memoryMiB":1,"cores":100}]}}`, v1.PodRunning),
		},
		wantNodes:   []string{"n"},
		wantUsed:    []allocator.Usage{{MemoryMiB: 8192, Cores: 20}, {MemoryMiB: 15360, Cores: 100}},
		wantHolders: [][]PodRef{{{"ns", "i"}}, {{"ns", "x"}}},
	}, {
		name:  "invalid annotations are problems, not crashes",
		nodes: []v1.Node{node("n", inventory), node("bad", `{"version":3}`), node("junk", `{`)},
		pods: []v1.Pod{
			pod("p", "n", `{"version":1,"containers":{"main":[{"index":0,"uuid":"GPU-a","memoryMiB":0,"cores":0}]}}`, v1.PodRunning),
			pod("q", "n", `not json`, v1.PodRunning),
		},
		wantNodes:   []string{"bad", "junk", "n"},
		wantUsed:    []allocator.Usage{{}, {}},
		wantHolders: [][]PodRef{nil, nil},
		wantProblems: []string{
			"node bad: tessera.io/gpu-inventory: version: unsupported version 3, want 1-2 (written by a newer node agent: upgrade the scheduler, or run the agent with --inventory-version=2)",
			"node junk: tessera.io/gpu-inventory: invalid JSON: unexpected end of JSON input",
			`pod ns/p: tessera.io/gpu-assignment: containers["main"][0].memoryMiB: 0 is outside 1-1048576 MiB`,
			"pod ns/q: tessera.io/gpu-assignment: invalid JSON: invalid character 'o' in literal null (expecting 'u')",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := Build(tc.nodes, tc.pods)
			var names []string
			for _, n := range s.Nodes {
				names = append(names, n.Name)
			}
			if diff := cmp.Diff(tc.wantNodes, names); diff != "" {
				t.Errorf("nodes (-want,+got):\n%s", diff)
			}
			n := s.Node("n")
			if n == nil {
				t.Fatal("node n missing")
			}
			if n.Cards[0].UUID != "GPU-a" {
				t.Errorf("cards not sorted by index: %+v", n.Cards)
			}
			if diff := cmp.Diff(tc.wantUsed, n.Used); diff != "" {
				t.Errorf("used (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantHolders, n.Holders); diff != "" {
				t.Errorf("holders (-want,+got):\n%s", diff)
			}
			var problems []string
			for _, p := range s.Problems {
				problems = append(problems, p.Error())
			}
			if diff := cmp.Diff(tc.wantProblems, problems); diff != "" {
				t.Errorf("problems (-want,+got):\n%s", diff)
			}
			for _, bad := range s.Nodes {
				if bad.Err != nil && (len(bad.Cards) != 0 || !strings.Contains(bad.Err.Error(), gpuinfo.InventoryAnnotation)) {
					t.Errorf("node %s: invalid inventory yet %d cards, error %v", bad.Name, len(bad.Cards), bad.Err)
				}
			}
		})
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		used, capacity int64
		want           string
	}{
		{0, 100, "[................]"},
		{50, 100, "[########........]"},
		{150, 100, "[################]"},
		{-1, 100, "[................]"},
		{5, 0, "[................]"},
	} {
		if got := Bar(tc.used, tc.capacity); got != tc.want {
			t.Errorf("Bar(%d, %d) = %q, want %q", tc.used, tc.capacity, got, tc.want)
		}
	}
}
