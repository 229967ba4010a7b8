// Package scheme registers Tessera's plugin arguments in kube-scheduler's
// configuration scheme. Import it (for its side effect) wherever the
// scheduler's configuration is loaded.
package scheme

import (
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	configv1 "github.com/tessera-gpu/tessera/pkg/apis/config/v1"
)

func init() {
	utilruntime.Must(config.AddToScheme(schedscheme.Scheme))
	utilruntime.Must(configv1.AddToScheme(schedscheme.Scheme))
}
