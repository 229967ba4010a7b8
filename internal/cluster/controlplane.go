// Package cluster runs a real Kubernetes control plane inside the current
// process — embedded etcd and kube-apiserver, nothing to download — and
// Tessera's scheduler against it, with simulated GPU nodes. The integration
// suite and `make demo` both use it.
package cluster

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"

	"github.com/tessera-gpu/tessera/internal/install"
	"github.com/tessera-gpu/tessera/manifests"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// ControlPlane is an embedded etcd and a kube-apiserver serving on loopback,
// with Tessera installed from its manifests.
type ControlPlane struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// SchedulerConfig is the KubeSchedulerConfiguration of the installed
	// scheduler ConfigMap.
	SchedulerConfig []byte
	r               *runner
}

// Start starts etcd and kube-apiserver, with Node and RBAC authorization as
// in a production cluster, and installs Tessera's manifests (RBAC, admission
// policies, workloads) as `kubectl apply -k manifests` would, waiting until
// the admission policies are in force. Without a controller manager, the
// ServiceAccount and TaintNodesByCondition admission plugins are off (no
// default service accounts; new nodes carry no not-ready taint), no
// endpoint reconciler runs, and the installed Deployment and DaemonSet start
// no pods: the scheduler and agents run in this process (StartScheduler,
// AddSimulatedNode) under the manifests' identities. logf receives the
// servers' progress messages.
func Start(logf func(format string, args ...any), options ...Option) (cp *ControlPlane, err error) {
	var o startOptions
	for _, opt := range options {
		opt(&o)
	}
	// The API server and the scheduler both apply logging options.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	r := &runner{logf: logf}
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(fatal)
			if !ok {
				panic(p)
			}
			r.cleanup()
			cp, err = nil, fmt.Errorf("starting the control plane: %s", f.msg)
		}
	}()
	etcdURL, err := startEtcd(r)
	if err != nil {
		r.cleanup()
		return nil, err
	}
	storage := storagebackend.NewDefaultConfig("/registry", nil)
	storage.Transport.ServerList = []string{etcdURL}
	opts := kubeapiservertesting.NewDefaultTestServerOptions()
	opts.DisableInvariantChecks = true
	flags := []string{
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--endpoint-reconciler-type=none",
		"--authorization-mode=Node,RBAC",
		// As kubeadm and managed clusters run it: the node agent's pod is
		// privileged (docs/install.md).
		"--allow-privileged=true",
		// Feature gates are one set per process: this is the scheduler's,
		// as its Deployment sets it (manifests/base/scheduler/deployment.yaml).
		"--feature-gates=" + manifests.SchedulerFeatureGates,
	}
	if o.gangs {
		flags = append(flags, "--runtime-config=scheduling.k8s.io/v1beta1=true", "--feature-gates=GenericWorkload=true")
	}
	server, err := kubeapiservertesting.StartTestServer(r, opts, flags, storage)
	if err != nil {
		r.cleanup()
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	r.Cleanup(server.TearDownFn)
	client, err := kubernetes.NewForConfig(server.ClientConfig)
	if err != nil {
		r.cleanup()
		return nil, err
	}
	cp = &ControlPlane{Config: server.ClientConfig, Client: client, r: r}
	if err := cp.install(o.manifests); err != nil {
		r.cleanup()
		return nil, err
	}
	return cp, nil
}

// Option changes how Start starts the control plane.
type Option func(*startOptions)

type startOptions struct {
	gangs bool
	// manifests, when set, are installed instead of the embedded base.
	manifests fs.FS
}

// WithGangScheduling serves the PodGroup API (scheduling.k8s.io/v1beta1)
// and turns the GenericWorkload feature gate on — for the API server and,
// the gate being the process's, for schedulers started in this process:
// kube-scheduler's GangScheduling plugin then holds a PodGroup's pods at
// Permit until the whole gang fits.
func WithGangScheduling() Option { return func(o *startOptions) { o.gangs = true } }

// WithManifests installs the kustomization at the root of fsys (an earlier
// release's manifests, for an upgrade test) instead of the embedded base.
// Start then waits for its resource to be served but not for today's
// admission policies, which it may not have.
func WithManifests(fsys fs.FS) Option { return func(o *startOptions) { o.manifests = fsys } }

// install applies the manifests' base (or those of fsys, when set) and
// waits for its resource and, for the base, its admission policies.
func (cp *ControlPlane) install(fsys fs.FS) error {
	var objs []*unstructured.Unstructured
	var err error
	if fsys != nil {
		objs, err = install.RenderFS(fsys, install.Base)
	} else {
		objs, err = install.Render(install.Base)
	}
	if err != nil {
		return err
	}
	if cp.SchedulerConfig, err = install.SchedulerConfig(objs); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := install.Apply(ctx, cp.Config, objs); err != nil {
		return fmt.Errorf("installing the manifests: %w", err)
	}
	if err := install.WaitServed(ctx, cp.Config, objs, time.Minute); err != nil {
		return err
	}
	if fsys != nil {
		return nil
	}
	return install.WaitEnforced(ctx, cp.Config, gpuinfo.DefaultResourceNames(), time.Minute)
}

// AgentConfig reaches the API server as the node agent of node, under the
// manifests' identity for it.
func (cp *ControlPlane) AgentConfig(node string) *rest.Config {
	return install.AsAgent(cp.Config, node)
}

// AgentClient is a clientset for AgentConfig(node).
func (cp *ControlPlane) AgentClient(node string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cp.AgentConfig(node))
}

// Stop shuts the API server and etcd down and removes their files.
func (cp *ControlPlane) Stop() { cp.r.cleanup() }

func startEtcd(r *runner) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	cfg := embed.NewConfig()
	cfg.UnsafeNoFsync = true
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.Dir = filepath.Join(r.TempDir(), "etcd")
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return "", err
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", fmt.Errorf("starting etcd: %w", err)
	}
	r.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return "", fmt.Errorf("etcd did not become ready within 60s")
	}
	return clientURL.String(), nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// WriteKubeconfig writes a kubeconfig file for the control plane's admin.
func (cp *ControlPlane) WriteKubeconfig(path string) error { return WriteKubeconfig(cp.Config, path) }

// WriteSchedulerKubeconfig writes a kubeconfig file that acts as the
// scheduler's ServiceAccount.
func (cp *ControlPlane) WriteSchedulerKubeconfig(path string) error {
	return WriteKubeconfig(install.AsScheduler(cp.Config), path)
}

// WriteKubeconfig writes a kubeconfig file for c, impersonation included.
func WriteKubeconfig(c *rest.Config, path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tessera"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData, TLSServerName: c.ServerName, InsecureSkipTLSVerify: c.Insecure}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{
		Token: c.BearerToken, ClientCertificateData: c.CertData, ClientKeyData: c.KeyData,
		Impersonate: c.Impersonate.UserName, ImpersonateUID: c.Impersonate.UID, ImpersonateGroups: c.Impersonate.Groups, ImpersonateUserExtra: c.Impersonate.Extra,
	}
	cfg.Contexts["tessera"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: "user"}
	cfg.CurrentContext = "tessera"
	return clientcmd.WriteToFile(*cfg, path)
}
