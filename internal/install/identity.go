package install

import (
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/manifests"
)

// NodeNameExtra is the user extra in which the API server puts the node of
// the pod a ServiceAccount token is bound to (GA since Kubernetes 1.32). The
// admission policies compare it with the node an agent writes.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// SchedulerUser is the scheduler's ServiceAccount as the API server names it.
var SchedulerUser = serviceaccount.MakeUsername(manifests.Namespace, manifests.SchedulerServiceAccount)

// AgentUser is the node agents' ServiceAccount as the API server names it.
var AgentUser = serviceaccount.MakeUsername(manifests.Namespace, manifests.AgentServiceAccount)

// AsScheduler returns a copy of cfg that acts as the scheduler's
// ServiceAccount.
func AsScheduler(cfg *rest.Config) *rest.Config {
	return as(cfg, rest.ImpersonationConfig{UserName: SchedulerUser, Groups: serviceaccount.MakeGroupNames(manifests.Namespace)})
}

// AsAgent returns a copy of cfg that acts as the node agent's ServiceAccount
// with a token bound to a pod on node, as the agent's projected token is.
func AsAgent(cfg *rest.Config, node string) *rest.Config {
	return as(cfg, rest.ImpersonationConfig{
		UserName: AgentUser,
		Groups:   serviceaccount.MakeGroupNames(manifests.Namespace),
		Extra:    map[string][]string{NodeNameExtra: {node}},
	})
}

func as(cfg *rest.Config, id rest.ImpersonationConfig) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = id
	return c
}
