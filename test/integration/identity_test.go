package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/cluster"
	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/node-agent/agent"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/metrics"
	"github.com/tessera-gpu/tessera/node-agent/nri"
	"github.com/tessera-gpu/tessera/node-agent/publish"
	"github.com/tessera-gpu/tessera/node-agent/serving"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// tokenConfig reaches the API server with token alone, as a pod's projected
// ServiceAccount token does.
func tokenConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(controlPlane.Config)
	cfg.BearerToken = token
	return cfg
}

// serviceAccountToken asks the TokenRequest API for a token of the
// ServiceAccount, bound to pod when one is given (as kubelet asks for a
// pod's projected token).
func (e *env) serviceAccountToken(namespace, account string, pod *v1.Pod) string {
	e.tCtx.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	got, err := e.client.CoreV1().ServiceAccounts(namespace).CreateToken(e.tCtx, account, req, metav1.CreateOptions{})
	if err != nil {
		e.tCtx.Fatalf("a token for %s/%s: %v", namespace, account, err)
	}
	return got.Status.Token
}

func newClient(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestInstalledIdentities runs the scheduler and a node agent with the
// credentials a cluster gives them — tokens from the TokenRequest API, the
// agent's bound to its pod on its node, as kubelet projects them — under the
// installed RBAC and admission policies: both do their work (the agent
// publishes, heartbeats, watches its node's pods and reports a failed card;
// the scheduler places and binds a GPU pod with its assignment and serves
// its secure port with delegated authentication), both serve every metric
// the shipped alerts and dashboard read, and the agent can do nothing
// beyond it.
func TestInstalledIdentities(t *testing.T) {
	e := newEnv(t)
	node := e.agentNode("gpu", 2)
	other := e.node("other", cluster.L4, 1, nil)

	// The agent's pod, as the DaemonSet would place it on the node.
	agentPod, err := e.client.CoreV1().Pods(manifests.Namespace).Create(e.tCtx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-node-agent-" + e.ns},
		Spec: v1.PodSpec{
			NodeName:           node,
			ServiceAccountName: manifests.AgentServiceAccount,
			Containers:         []v1.Container{{Name: "agent", Image: "tessera-node-agent"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.CoreV1().Pods(manifests.Namespace).Delete(context.Background(), agentPod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	agentClient := newClient(t, tokenConfig(e.serviceAccountToken(manifests.Namespace, manifests.AgentServiceAccount, agentPod)))
	review, err := agentClient.AuthenticationV1().SelfSubjectReviews().Create(e.tCtx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != install.AgentUser || strings.Join(u.Extra[install.NodeNameExtra], ",") != node {
		t.Fatalf("the agent's token authenticates as %s with node %v, want %s on %s", u.Username, u.Extra[install.NodeNameExtra], install.AgentUser, node)
	}

	// The agent's work.
	backend, err := discovery.NewSimulated(node, "2xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	pub := &publish.Publisher{Client: agentClient, NodeName: node, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
	if err := (&agent.Agent{Backend: backend, Publisher: pub}).Once(e.tCtx); err != nil {
		t.Fatalf("the agent could not publish under its identity: %v", err)
	}
	syncCtx, cancel := context.WithTimeout(e.tCtx, 30*time.Second)
	defer cancel()
	pods, err := nri.WatchPodsOnNode(syncCtx, agentClient, node)
	if err != nil {
		t.Fatalf("the agent cannot watch its node's pods: %v", err)
	}

	// The scheduler, serving its secure port as in the Deployment.
	dir := t.TempDir()
	kubeconfig, config := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml")
	if err := cluster.WriteKubeconfig(tokenConfig(e.serviceAccountToken(manifests.Namespace, manifests.SchedulerServiceAccount, nil)), kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WriteSchedulerConfig(controlPlane.SchedulerConfig, kubeconfig, config); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	s, err := cluster.StartScheduler(e.tCtx, config, fmt.Sprint("--secure-port=", port), "--bind-address=127.0.0.1",
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	e.create(e.podSpec("job", "tessera-binpack", map[string]int64{"tessera.io/gpu": 2}))
	job := e.waitBound(30*time.Second, "job")["job"]
	if p := placementOf(t, job); p.Node != node || len(p.Cards) != 2 {
		t.Errorf("placement %+v, want both cards of %s", p, node)
	}
	e.waitFor(10*time.Second, "the agent to see the pod bound to its node", func() (bool, error) {
		p, err := pods(e.ns, "job")
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && p.Annotations[gpuinfo.AssignmentAnnotation] != "", err
	})
	told, err := pub.ReportUnhealthyCard(e.tCtx, "GPU-sim-"+node+"-0", "XID 79")
	if err != nil || told != 1 {
		t.Errorf("GPUUnhealthy events: told %d pods, %v; want 1", told, err)
	}

	// The scheduler's secure port and the agent's metrics port: health
	// without credentials, metrics for the role and for no one else (a
	// tenant's token included), the agent's also with the token in the
	// header kubectl tessera top sends through the API server's pod proxy.
	promToken := e.metricsReaderToken()
	if _, err := e.client.CoreV1().ServiceAccounts(e.ns).Create(e.tCtx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenantToken := e.serviceAccountToken(e.ns, "tenant", nil)
	agentPort, collector := e.serveAgentMetrics(agentClient, node, backend)
	bearer := func(name, token string) http.Header { return http.Header{name: {"Bearer " + token}} }
	for _, tc := range []struct {
		port   int
		path   string
		header http.Header
		want   int
	}{
		{port, "/readyz", nil, http.StatusOK},
		{port, "/livez", nil, http.StatusOK},
		{port, "/metrics", nil, http.StatusForbidden},
		{port, "/metrics", bearer("Authorization", promToken), http.StatusOK},
		{agentPort, serving.HealthPath, nil, http.StatusOK},
		{agentPort, serving.ReadyPath, nil, http.StatusOK},
		{agentPort, "/metrics", nil, http.StatusUnauthorized},
		{agentPort, "/metrics", bearer("Authorization", "not-a-token"), http.StatusUnauthorized},
		{agentPort, "/metrics", bearer("Authorization", tenantToken), http.StatusForbidden},
		{agentPort, "/metrics", bearer("Authorization", promToken), http.StatusOK},
		{agentPort, "/metrics", bearer(gpuinfo.AgentMetricsTokenHeader, promToken), http.StatusOK},
		{agentPort, "/metrics", bearer(gpuinfo.AgentMetricsTokenHeader, tenantToken), http.StatusForbidden},
	} {
		if got, _ := e.httpsGet(tc.port, tc.path, tc.header); got != tc.want {
			t.Errorf("GET %s on port %d with %v: %d, want %d", tc.path, tc.port, slices.Collect(maps.Keys(tc.header)), got, tc.want)
		}
	}

	// Every Tessera metric the shipped alerts and dashboard read is served
	// on these ports (a name no component serves would leave an alert
	// silent or firing for ever): the scheduler's with a pod placed and one
	// pending, the agent's once it knows its cards and pods and has seen an
	// XID error, as its loops would tell it.
	e.create(e.podSpec("too-big", "tessera-binpack", map[string]int64{"tessera.io/gpu": 8}))
	e.waitUnschedulable("too-big")
	cards, err := backend.Cards()
	if err != nil {
		t.Fatal(err)
	}
	collector.Update(cards)
	collector.SetPods(func() ([]*v1.Pod, error) {
		list, err := e.client.CoreV1().Pods(e.ns).List(e.tCtx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return nil, err
		}
		pods := make([]*v1.Pod, len(list.Items))
		for i := range list.Items {
			pods[i] = &list.Items[i]
		}
		return pods, nil
	})
	collector.ObserveXID(cards[0].UUID, 79)
	served := map[string]bool{}
	for _, p := range []int{port, agentPort} {
		e.waitFor(30*time.Second, "the pending pod's reason in the scheduler's metrics", func() (bool, error) {
			code, body := e.httpsGet(p, "/metrics", bearer("Authorization", promToken))
			if code != http.StatusOK {
				return false, fmt.Errorf("GET /metrics on port %d: %d", p, code)
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(strings.NewReader(body))
			if err != nil {
				return false, fmt.Errorf("port %d serves metrics Prometheus cannot parse: %w", p, err)
			}
			for name := range families {
				served[name] = true
			}
			return p != port || served["tessera_gpu_pending_pods"], nil
		})
	}
	for _, name := range testutil.AlertMetrics(t) {
		if !served[name] {
			t.Errorf("the alerts or the dashboard read %s, which neither the scheduler nor the agent serves", name)
		}
	}

	// Nothing beyond its work: with its real token, the agent can neither
	// bind, nor touch another node or its Lease.
	e.create(e.podSpec("waiting", "nobody", nil))
	if err := agentClient.CoreV1().Pods(e.ns).Bind(e.tCtx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "waiting"}, Target: v1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent bound a pod: %v", err)
	}
	if _, err := agentClient.CoreV1().Nodes().Patch(e.tCtx, other, types.MergePatchType, mergePatch(t, "annotations", map[string]any{gpuinfo.InventoryAnnotation: nil}), metav1.PatchOptions{}); !install.DeniedBy(err, install.PolicyGPUInventory) {
		t.Errorf("the agent changed another node's inventory: %v", err)
	}
	otherPub := &publish.Publisher{Client: agentClient, NodeName: other, Namespace: manifests.Namespace, LeaseDuration: 40 * time.Second}
	if err := otherPub.Heartbeat(e.tCtx); !install.DeniedBy(err, install.PolicyAgentLeases) {
		t.Errorf("the agent renewed another node's Lease: %v", err)
	}
}

// metricsReaderToken is the token of a ServiceAccount bound to the shipped
// tessera-metrics-reader role, as Prometheus would be.
func (e *env) metricsReaderToken() string {
	e.tCtx.Helper()
	if _, err := e.client.CoreV1().ServiceAccounts(e.ns).Create(e.tCtx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-" + e.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "tessera-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: e.ns}},
	}
	if _, err := e.client.RbacV1().ClusterRoleBindings().Create(e.tCtx, binding, metav1.CreateOptions{}); err != nil {
		e.tCtx.Fatal(err)
	}
	e.tCtx.Cleanup(func() {
		_ = e.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	return e.serviceAccountToken(e.ns, "prometheus", nil)
}

// httpsGet GETs path from a secure port on this machine (its certificate
// is self-signed) with header, and returns the status code and the body.
func (e *env) httpsGet(port int, path string, header http.Header) (int, string) {
	e.tCtx.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a self-signed test server
	var code int
	var body []byte
	e.waitFor(30*time.Second, fmt.Sprintf("an answer from port %d", port), func() (bool, error) {
		req, err := http.NewRequestWithContext(e.tCtx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", port, path), nil)
		if err != nil {
			return false, err
		}
		for name, values := range header {
			req.Header[name] = values
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		code = resp.StatusCode
		body, err = io.ReadAll(resp.Body)
		return err == nil, nil
	})
	return code, string(body)
}

// serveAgentMetrics serves the agent's metrics port as the agent does, with
// client's identity reviewing the callers, on a free port of this machine;
// it returns the port and the collector, for the test to feed as the
// agent's loops would.
func (e *env) serveAgentMetrics(client kubernetes.Interface, node string, backend discovery.Backend) (int, *metrics.Collector) {
	e.tCtx.Helper()
	guard, err := serving.NewGuard(client)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	cert, err := serving.Certificate("", "", node)
	if err != nil {
		e.tCtx.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.tCtx.Fatal(err)
	}
	collector := metrics.New(node, backend)
	ctx, stop := context.WithCancel(e.tCtx)
	served := make(chan error, 1)
	go func() {
		served <- serving.Serve(ctx, ln, cert, guard.Handler(metrics.Handler(e.tCtx.Logger(), metrics.NewRegistry(collector)), serving.Probes{}))
	}()
	e.tCtx.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			e.tCtx.Errorf("the agent's metrics port: %v", err)
		}
	})
	return ln.Addr().(*net.TCPAddr).Port, collector
}
