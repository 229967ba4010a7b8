package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// fakeKubelet is kubelet's registration service on its unix socket.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	requests chan *pluginapi.RegisterRequest
	server   *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string, requests chan *pluginapi.RegisterRequest) *fakeKubelet {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{requests: requests, server: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(lis) }()
	t.Cleanup(k.server.Stop)
	return k
}

func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestDevicePluginAgainstKubeletSockets(t *testing.T) {
	tCtx := ktesting.Init(t)
	dir := testutil.SocketDir(t)
	requests := make(chan *pluginapi.RegisterRequest, 4)
	kubelet := startKubelet(t, dir, requests)

	p := &Plugin{Dir: dir, ResourceName: "tessera.io/gpu", Split: 4, CheckInterval: 20 * time.Millisecond}
	p.Update([]discovery.Card{
		{Index: 0, UUID: "GPU-a", NUMANode: -1, Healthy: true},
		{Index: 1, UUID: "GPU-b", NUMANode: 1, Healthy: true},
	})
	ctx, cancel := context.WithCancel(tCtx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	req := receive(t, "registration", requests)
	if req.Version != pluginapi.Version || req.Endpoint != SocketName || req.ResourceName != "tessera.io/gpu" {
		t.Errorf("registration = %+v", req)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	count := func(resp *pluginapi.ListAndWatchResponse) (healthy, unhealthy int) {
		for _, d := range resp.Devices {
			if d.Health == pluginapi.Healthy {
				healthy++
			} else {
				unhealthy++
			}
		}
		return
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if h, u := count(first); h != 8 || u != 0 {
		t.Errorf("first list: %d healthy, %d unhealthy; want 8 and 0", h, u)
	}
	if first.Devices[0].ID != "GPU-a::0" {
		t.Errorf("devices = %v", first.Devices)
	}
	// No topology hint, though card b is on NUMA node 1: kubelet's
	// topology manager must not align CPUs to a card the scheduler may not
	// give the container.
	for _, d := range first.Devices {
		if d.Topology != nil {
			t.Errorf("device %s advertises topology %v", d.ID, d.Topology)
		}
	}

	// Card b turns unhealthy: its four devices follow.
	p.Update([]discovery.Card{
		{Index: 0, UUID: "GPU-a", NUMANode: -1, Healthy: true},
		{Index: 1, UUID: "GPU-b", NUMANode: 1, Healthy: false},
	})
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if h, u := count(next); h != 4 || u != 4 {
		t.Errorf("after card b failed: %d healthy, %d unhealthy; want 4 and 4", h, u)
	}

	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::0"}}}})
	if err != nil || len(resp.ContainerResponses) != 1 {
		t.Errorf("Allocate = %v, %v", resp, err)
	}

	// Kubelet restarts: its socket is recreated; the plugin registers again.
	kubelet.server.Stop()
	os.Remove(filepath.Join(dir, "kubelet.sock"))
	startKubelet(t, dir, requests)
	if again := receive(t, "registration after the kubelet restart", requests); again.ResourceName != "tessera.io/gpu" {
		t.Errorf("second registration = %+v", again)
	}
}
