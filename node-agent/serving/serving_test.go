package serving

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProbes: the probe paths answer anyone, without credentials, and a
// failing probe does not say why (the reason may tell a tenant that a
// node's enforcement is down).
func TestProbes(t *testing.T) {
	secret := errors.New("NRI plugin not connected since 12:00")
	for _, tc := range []struct {
		name     string
		path     string
		probes   Probes
		wantCode int
	}{
		{"alive", HealthPath, Probes{Live: func() error { return nil }}, http.StatusOK},
		{"dead", HealthPath, Probes{Live: func() error { return secret }}, http.StatusServiceUnavailable},
		{"ready", ReadyPath, Probes{Ready: func() error { return nil }}, http.StatusOK},
		{"not ready", ReadyPath, Probes{Ready: func() error { return secret }}, http.StatusServiceUnavailable},
		{"no probe", ReadyPath, Probes{}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No authenticator: the probes must not reach one.
			handler := (&Guard{}).Handler(http.NotFoundHandler(), tc.probes)
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tc.wantCode {
				t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.wantCode)
			}
			if strings.Contains(string(body), "NRI") {
				t.Errorf("GET %s answered the reason: %q", tc.path, body)
			}
		})
	}
}
