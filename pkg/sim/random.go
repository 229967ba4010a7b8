package sim

import (
	"context"
	"hash/fnv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// RandomProfile is a replay-only profile that places each pod on a node
// chosen at random among those that fit (cards chosen by the tightest fit,
// as tessera-binpack does): the baseline every policy should beat.
const RandomProfile = "random"

// randomScoreName is the replay-only score plugin behind RandomProfile.
const randomScoreName = "RandomScore"

// randomScore scores nodes by a hash of the pod and the node, so that a
// replay is random but reproducible, and keeps the highest alone at the top
// so that no tie is left for kube-scheduler to break.
type randomScore struct{}

var (
	_ fwk.ScorePlugin     = randomScore{}
	_ fwk.ScoreExtensions = randomScore{}
)

func newRandomScore(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) {
	return randomScore{}, nil
}

// Name returns the plugin's name.
func (randomScore) Name() string { return randomScoreName }

// Score is the hash's draw for the node, kept whole until NormalizeScore.
func (randomScore) Score(_ context.Context, _ fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	h := fnv.New64a()
	h.Write([]byte(pod.Name))
	h.Write([]byte{0})
	h.Write([]byte(pod.UID))
	h.Write([]byte{0})
	h.Write([]byte(nodeInfo.Node().Name))
	return int64(h.Sum64() >> 1), nil
}

// ScoreExtensions returns the plugin itself, for NormalizeScore.
func (r randomScore) ScoreExtensions() fwk.ScoreExtensions { return r }

// NormalizeScore gives the node with the highest draw the top score and
// every other node none.
func (randomScore) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	best := 0
	for i := range scores {
		if scores[i].Score > scores[best].Score {
			best = i
		}
	}
	for i := range scores {
		scores[i].Score = fwk.MinNodeScore
	}
	if len(scores) > 0 {
		scores[best].Score = fwk.MaxNodeScore
	}
	return nil
}

// randomProfile turns the binpack profile into RandomProfile: its filters
// and card choice, no score plugin but randomScore.
func randomProfile(binpack schedconfig.KubeSchedulerProfile) schedconfig.KubeSchedulerProfile {
	p := *binpack.DeepCopy()
	p.SchedulerName = RandomProfile
	p.Plugins.Score = schedconfig.PluginSet{
		Enabled:  []schedconfig.Plugin{{Name: randomScoreName, Weight: 1}},
		Disabled: []schedconfig.Plugin{{Name: "*"}},
	}
	return p
}
