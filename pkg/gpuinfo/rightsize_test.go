package gpuinfo_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

func TestQuietPeriod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		value   *string
		want    time.Duration
		on      bool
		wantErr string
	}{
		{name: "no annotation"},
		{name: "off", value: ptr.To("false")},
		{name: "on, default", value: ptr.To("true"), want: 30 * time.Minute, on: true},
		{name: "own period", value: ptr.To("2h"), want: 2 * time.Hour, on: true},
		{name: "shortest", value: ptr.To("1m"), want: time.Minute, on: true},
		{name: "too short", value: ptr.To("30s"), wantErr: `team-a/nb: annotation tessera.io/right-size="30s"`},
		{name: "too long", value: ptr.To("25h"), wantErr: "from 1m0s to 24h0m0s"},
		{name: "negative", value: ptr.To("-1h"), wantErr: "-1h"},
		{name: "not a duration", value: ptr.To("yes"), wantErr: `want "true", "false" or a quiet period`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "nb"}}
			if tc.value != nil {
				pod.Annotations = map[string]string{gpuinfo.RightSizeAnnotation: *tc.value}
			}
			got, on, err := gpuinfo.QuietPeriod(pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || on {
					t.Fatalf("QuietPeriod = %v, %v, %v; want an error containing %q", got, on, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || on != tc.on {
				t.Fatalf("QuietPeriod = %v, %v, %v; want %v, %v", got, on, err, tc.want, tc.on)
			}
		})
	}
}

func TestUseReportCodec(t *testing.T) {
	report := &gpuinfo.UseReport{Containers: []gpuinfo.ContainerUse{
		{Namespace: "team-a", Pod: "nb", UID: "u1", Container: "main", UseMiB: 900, PeakMiB: 2100, WindowSeconds: 1800},
	}}
	raw, err := report.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpuinfo.DecodeUseReport(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(report, got); diff != "" {
		t.Errorf("round trip (-want,+got):\n%s", diff)
	}
	for _, tc := range []struct{ name, raw, wantErr string }{
		{"not JSON", `{`, "tessera.io/gpu-use: invalid JSON"},
		{"no pod", `{"containers":[{"namespace":"a","container":"c"}]}`, "containers[0]: namespace, pod and container are required"},
		{"negative use", `{"containers":[{"namespace":"a","pod":"p","container":"c","useMiB":-1}]}`, "want 0 <= useMiB <= peakMiB"},
		{"peak below use", `{"containers":[{"namespace":"a","pod":"p","container":"c","useMiB":5,"peakMiB":4}]}`, "useMiB 5 and peakMiB 4"},
		{"huge peak", `{"containers":[{"namespace":"a","pod":"p","container":"c","peakMiB":9999999999}]}`, "peakMiB 9999999999"},
		{"window too long", `{"containers":[{"namespace":"a","pod":"p","container":"c","windowSeconds":90000}]}`, "windowSeconds 90000: want 0 to 86400"},
		{"oversized", `{"containers":[],"pad":"` + strings.Repeat("x", gpuinfo.MaxAnnotationBytes) + `"}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := gpuinfo.DecodeUseReport(tc.raw); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("DecodeUseReport = %v; want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
