// Package kueue proves Tessera with a real Kueue (docs/queues.md): Kueue's
// manager, built from its own module (test/kueue/tools), runs as a process
// against the in-process kube-apiserver and etcd, with its CRDs and
// webhooks installed as its release installs them; Tessera's scheduler and
// simulated GPU nodes run in this process. Run it with `make test-kueue`,
// which builds the manager and says where its module is.
package kueue

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/internal/cluster"
)

// Set by `make test-kueue`.
const (
	binEnv    = "TESSERA_KUEUE_BIN" // the manager's binary
	moduleEnv = "TESSERA_KUEUE_DIR" // Kueue's module (its CRDs and webhooks)
)

// managedLabel marks the namespaces Kueue manages pods in (its
// managedJobsNamespaceSelector, and its webhooks' namespaceSelector).
const managedLabel = "tessera.io/kueue-test"

// metricsCertDir is where Kueue's manager reads its metrics certificate
// when its internal certificates are off (fixed in its cmd/kueue).
const metricsCertDir = "/etc/kueue/metrics/certs"

var controlPlane *cluster.ControlPlane

func TestMain(m *testing.M) {
	bin, dir := os.Getenv(binEnv), os.Getenv(moduleEnv)
	if bin == "" || dir == "" {
		fmt.Printf("skipping the Kueue tests: %s and %s are not set (run make test-kueue, which builds Kueue's manager)\n", binEnv, moduleEnv)
		os.Exit(0)
	}
	start := time.Now()
	cp, err := cluster.Start(func(format string, args ...any) { klog.V(2).Infof(format, args...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	controlPlane = cp
	stop, err := startKueue(cp, bin, dir)
	if err != nil {
		cp.Stop()
		fmt.Fprintln(os.Stderr, "starting Kueue:", err)
		os.Exit(1)
	}
	fmt.Printf("control plane and Kueue ready in %v\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	stop()
	cp.Stop()
	os.Exit(code)
}

// startKueue installs Kueue's CRDs and webhooks from its module dir and runs
// its manager, serving its webhooks on loopback with a certificate of its
// own; it returns once the manager is ready, and a function that stops it.
func startKueue(cp *cluster.ControlPlane, bin, dir string) (func(), error) {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "tessera-kueue-")
	if err != nil {
		return nil, err
	}
	caPEM, err := writeServingCert(filepath.Join(work, "certs"))
	if err != nil {
		return nil, err
	}
	if err := ensureMetricsCert(filepath.Join(work, "certs")); err != nil {
		return nil, err
	}
	if err := installCRDs(ctx, cp, filepath.Join(dir, "config", "components", "crd", "bases")); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	webhookPort, healthPort := ports[0], ports[1]
	if err := installWebhooks(ctx, cp, filepath.Join(dir, "config", "components", "webhook", "manifests.yaml"), webhookPort, caPEM); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig); err != nil {
		return nil, err
	}
	config := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
managedJobsNamespaceSelector:
  matchLabels: {%q: "true"}
integrations:
  frameworks: ["pod"]
`, healthPort, webhookPort, filepath.Join(work, "certs"), managedLabel)
	configFile := filepath.Join(work, "config.yaml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(work, "kueue.log"))
	if err != nil {
		return nil, err
	}
	// The on-demand visibility API would serve with a certificate from
	// /visibility: not needed here.
	cmd := exec.Command(bin, "--config="+configFile, "--kubeconfig="+kubeconfig, "--zap-log-level=2", "--feature-gates=VisibilityOnDemand=false")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = logFile.Close()
		_ = os.RemoveAll(work)
	}
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			return false, fmt.Errorf("Kueue's manager exited: %v", err)
		default:
		}
		resp, err := http.Get(ready)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		log, _ := os.ReadFile(logFile.Name())
		stop()
		return nil, fmt.Errorf("%w; its log ends:\n%s", err, tail(log, 4000))
	}
	return stop, nil
}

// tail is the end of a log, at most n bytes.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// installCRDs creates every CRD in dir and waits until each is served.
func installCRDs(ctx context.Context, cp *cluster.ControlPlane, dir string) error {
	client, err := apiextensionsclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s: %v", dir, err)
	}
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			established := slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			})
			if !established {
				return false, nil
			}
		}
		return true, nil
	})
}

// installWebhooks creates Kueue's webhook configurations from its release
// manifest, for its own API and pods only (the frameworks of other
// controllers are not enabled), calling the manager on loopback at port
// and limited to the namespaces labelled managedLabel (cluster-scoped
// objects are always sent).
func installWebhooks(ctx context.Context, cp *cluster.ControlPlane, manifest string, port int, caPEM []byte) error {
	raw, err := os.ReadFile(manifest)
	if err != nil {
		return err
	}
	ours := func(rules []admissionregistrationv1.RuleWithOperations) bool {
		return slices.ContainsFunc(rules, func(r admissionregistrationv1.RuleWithOperations) bool {
			return slices.Contains(r.APIGroups, "kueue.x-k8s.io") || slices.Contains(r.Resources, "pods")
		})
	}
	clientConfig := func(c admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.WebhookClientConfig {
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, *c.Service.Path)
		return admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{managedLabel: "true"}}
	client := cp.Client.AdmissionregistrationV1()
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			return err
		}
		switch kind.Kind {
		case "MutatingWebhookConfiguration":
			c := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, c); err != nil {
				return err
			}
			c.Webhooks = slices.DeleteFunc(c.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return !ours(w.Rules) })
			for i := range c.Webhooks {
				c.Webhooks[i].ClientConfig, c.Webhooks[i].NamespaceSelector = clientConfig(c.Webhooks[i].ClientConfig), selector
			}
			c.Name = "kueue-" + c.Name
			if _, err := client.MutatingWebhookConfigurations().Create(ctx, c, metav1.CreateOptions{}); err != nil {
				return err
			}
		case "ValidatingWebhookConfiguration":
			c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, c); err != nil {
				return err
			}
			c.Webhooks = slices.DeleteFunc(c.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return !ours(w.Rules) })
			for i := range c.Webhooks {
				c.Webhooks[i].ClientConfig, c.Webhooks[i].NamespaceSelector = clientConfig(c.Webhooks[i].ClientConfig), selector
			}
			c.Name = "kueue-" + c.Name
			if _, err := client.ValidatingWebhookConfigurations().Create(ctx, c, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeServingCert writes a certificate for 127.0.0.1 and its key into dir
// as tls.crt and tls.key, signed by a CA of its own, whose certificate it
// returns (PEM).
func writeServingCert(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tessera-kueue-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// ensureMetricsCert puts a certificate where Kueue's manager reads its
// metrics certificate (metrics are not served: bindAddress "0"), unless
// one is there: a copy of the one in certs.
func ensureMetricsCert(certs string) error {
	if _, err := os.Stat(filepath.Join(metricsCertDir, "tls.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(metricsCertDir, 0o755); err != nil {
		return fmt.Errorf("Kueue's manager reads %s (fixed in its cmd/kueue); creating it needs root: %w", metricsCertDir, err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		b, err := os.ReadFile(filepath.Join(certs, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(metricsCertDir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// freePorts returns n loopback ports free now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// newNamespace creates a namespace Kueue manages, removed when the test
// ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns, err := controlPlane.Client.CoreV1().Namespaces().Create(t.Context(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "k-", Labels: map[string]string{managedLabel: "true"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}
