package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"k8s.io/kubernetes/test/utils/ktesting"
)

// TestDemoOnce runs `demo --once` end to end, so the newcomer's first
// command cannot rot.
func TestDemoOnce(t *testing.T) {
	tCtx := ktesting.Init(t)
	var out bytes.Buffer
	err := run(tCtx, options{once: true, examples: "../../manifests/examples", workDir: t.TempDir()}, &out)
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	got := out.String()
	t.Log("\n" + got)
	for _, want := range []*regexp.Regexp{
		// binpack: inference replicas share a card.
		regexp.MustCompile(`(?m)^\S+\s+\d+\s+.*llm-inference-\d, llm-inference-\d$`),
		// model selector and topology: the notebooks go into the first
		// NVLink quad of the H100s, the 4-card job gets the other whole.
		regexp.MustCompile(`(?m)^h100-node\s+[0-3]\s+NVIDIA H100.*h100-notebook$`),
		regexp.MustCompile(`(?m)^t4-node\s+\d\s+Tesla T4.*video-pipeline$`),
		regexp.MustCompile(`default/too-big: .*GPUs: the pod needs 1 GPU with 163840 MiB; 4 nodes with at most 81920 MiB free on a GPU; 1 node whose GPUs are DRA devices, for resource claims only; 1 node with only GPUs in MIG mode; 1 node without GPUs`),
		// MIG: a slice of its own, the smallest that holds 8000 MiB; two
		// memory shares inside the 1g.5gb slice.
		regexp.MustCompile(`(?m)^a100-mig-node\s+0/2g\.10gb@4\s+.*9856/9856 .*mig-inference$`),
		regexp.MustCompile(`(?m)^a100-mig-node\s+0/1g\.5gb@6\s+.*4000/4864 .*mig-notebook-a, mig-notebook-b$`),
		// dynamic MIG: the 4g.20gb slice made on card 1 for its pod.
		regexp.MustCompile(`(?m)^a100-mig-node\s+1/4g\.20gb@0\s+.*19968/19968 .*mig-trainer$`),
		// a pod without GPUs goes to the node without GPUs.
		regexp.MustCompile(`(?m)^Without GPUs:\n  default/web on cpu-node\n`),
		// priority: the critical pod preempted one batch job and took its L4.
		regexp.MustCompile(`(?m)^l4-node\s+\d\s+NVIDIA L4.*l4-critical$`),
		regexp.MustCompile(`(?m)^  default/l4-batch-\d for default/l4-critical on l4-node$`),
		// claims: the two notebooks' DRA claims share one card of the DRA node.
		regexp.MustCompile(`(?m)^l4-dra-node\s+\d\s+NVIDIA L4 \(DRA\)\s+\S+\s+12288/23034\s+\S+\s+40%\s+notebook-carol, notebook-dave$`),
		// gangs: one bound whole, one that cannot fit waits holding nothing.
		regexp.MustCompile(`default/too-wide-\d: .*pod group is unschedulable`),
		// resize: the idle notebook gave half its share back, without a
		// restart, through the scheduler and its node's agent.
		regexp.MustCompile(`GPUShareResize notebook-alice-idle applied: container "jupyter" holds 4096 MiB and 20% of card \d`),
	} {
		if !want.MatchString(got) {
			t.Errorf("output does not match %s", want)
		}
	}
	// The table is printed again after the resize: count in the last one.
	_, last, found := strings.Cut(got, "GPUShareResize notebook-alice-idle applied")
	if !found {
		last = got
	}
	if !strings.Contains(last, "4096/81920") {
		t.Error("the table after the resize does not show the notebook's card with 4096 MiB allocated")
	}
	if n := len(regexp.MustCompile(`(?m)^a100-node\s+\d\s+.*allreduce-\d$`).FindAllString(last, -1)); n != 6 {
		t.Errorf("the allreduce gang holds %d A100s, want 6 (3 workers × 2)", n)
	}
	if strings.Contains(got, "too-wide-0 ") || regexp.MustCompile(`(?m)too-wide-\d$`).MatchString(got) {
		t.Error("a pod of the gang that cannot fit holds cards")
	}
	if n := len(regexp.MustCompile(`(?m)^h100-node\s+[4-7]\s+NVIDIA H100.*pretrain-h100$`).FindAllString(last, -1)); n != 4 {
		t.Errorf("pretrain-h100 is on %d of the H100 cards 4-7, want 4 (one NVLink quad)", n)
	}
	// spread: the notebooks are on different cards.
	alice, bob := cardOf(got, "notebook-alice"), cardOf(got, "notebook-bob")
	if alice == "" || bob == "" || alice == bob {
		t.Errorf("notebooks on cards %q and %q, want two different cards", alice, bob)
	}
}

// cardOf returns "node card" of the table row listing pod, or "".
func cardOf(table, pod string) string {
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(line, pod) {
			return f[0] + " " + f[1]
		}
	}
	return ""
}
