// Package serving serves the node agent's HTTPS port as kube-scheduler serves
// its secure port: the health path to anyone (kubelet's probes carry no
// credentials), every other path only to callers the API server
// authenticates (TokenReview) and authorizes (SubjectAccessReview for the
// non-resource path, as RBAC's nonResourceURLs grant it).
package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

const (
	// HealthPath answers without authentication whether the agent is alive
	// (Probes.Live), for kubelet's liveness probe.
	HealthPath = "/healthz"
	// ReadyPath answers without authentication whether the agent is ready
	// (Probes.Ready), for kubelet's readiness probe.
	ReadyPath = "/readyz"
	// How long the API server's answers are kept: kube-scheduler's defaults.
	tokenCacheTTL  = 10 * time.Second
	allowCacheTTL  = 10 * time.Second
	denyCacheTTL   = 10 * time.Second
	reviewTimeout  = 10 * time.Second
	shutdownPeriod = 5 * time.Second
)

// reviewBackoff retries a TokenReview or SubjectAccessReview that failed:
// the API server's own webhook defaults.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// Guard admits requests to a protected handler.
type Guard struct {
	authn authenticator.Request
	authz authorizer.Authorizer
}

// NewGuard reviews tokens and access through client's API server. The
// caller's identity needs the ClusterRole system:auth-delegator.
func NewGuard(client kubernetes.Interface) (*Guard, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: reviewTimeout,
		WebhookRetryBackoff:      &reviewBackoff,
		CacheTTL:                 tokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             allowCacheTTL,
		DenyCacheTTL:              denyCacheTTL,
		WebhookRetryBackoff:       &reviewBackoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("subject access review: %w", err)
	}
	return &Guard{authn: authn, authz: authz}, nil
}

// Probes answer HealthPath and ReadyPath: nil when the agent is alive or
// ready, else why not. A nil probe always answers ok.
type Probes struct {
	Live, Ready func() error
}

// answer writes 200 "ok", or 503 without the reason: the probe paths answer
// anyone, and when a node's enforcement is down is not for tenants to learn
// (the reason is logged, and on the agent's Lease).
func answer(w http.ResponseWriter, r *http.Request, probe func() error) {
	if probe != nil {
		if err := probe(); err != nil {
			klog.FromContext(r.Context()).V(2).Info("Probe failed", "path", r.URL.Path, "err", err)
			http.Error(w, "failed", http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = w.Write([]byte("ok"))
}

// Handler serves the probes to anyone and protected to the callers allowed
// to get the request's path: 401 without a valid token, 403 without the
// permission.
func (g *Guard) Handler(protected http.Handler, probes Probes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case HealthPath:
			answer(w, r, probes.Live)
			return
		case ReadyPath:
			answer(w, r, probes.Ready)
			return
		}
		if r.Header.Get("Authorization") == "" {
			if forwarded := r.Header.Get(gpuinfo.AgentMetricsTokenHeader); forwarded != "" {
				r.Header.Set("Authorization", forwarded)
			}
		}
		r.Header.Del(gpuinfo.AgentMetricsTokenHeader)
		resp, ok, err := g.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			klog.FromContext(r.Context()).V(4).Info("Unauthenticated request", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized: a bearer token the API server accepts is required", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: resp.User, Verb: verbOf(r.Method), Path: r.URL.Path}
		decision, reason, err := g.authz.Authorize(r.Context(), attrs)
		if err != nil || decision != authorizer.DecisionAllow {
			klog.FromContext(r.Context()).V(2).Info("Forbidden request", "user", resp.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path, "reason", reason, "err", err)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s path %q", resp.User.GetName(), attrs.Verb, r.URL.Path), http.StatusForbidden)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// verbOf is the RBAC verb of a non-resource request's method, as the API
// server derives it.
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodDelete:
		return "delete"
	case http.MethodPatch:
		return "patch"
	}
	return strings.ToLower(method)
}

// Certificate loads the serving certificate from certFile and keyFile, or,
// when both are empty, generates a self-signed one for host in memory (as
// kube-scheduler does without --tls-cert-file).
func Certificate(certFile, keyFile, host string) (tls.Certificate, error) {
	switch {
	case certFile != "" && keyFile != "":
		return tls.LoadX509KeyPair(certFile, keyFile)
	case certFile != "" || keyFile != "":
		return tls.Certificate{}, errors.New("give both --tls-cert-file and --tls-private-key-file, or neither")
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// Serve serves handler over TLS with cert on ln until ctx ends.
func Serve(ctx context.Context, ln net.Listener, cert tls.Certificate, handler http.Handler) error {
	server := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownPeriod)
		defer cancel()
		_ = server.Shutdown(shutdownCtx)
	}()
	err := server.ServeTLS(ln, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		<-stopped
		return nil
	}
	return err
}
