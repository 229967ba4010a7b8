// Package deviceplugin advertises the node's cards to kubelet through the
// device-plugin API (v1beta1 over unix sockets): the resource tessera.io/gpu
// with cards × split devices, each carrying its card's health. It makes the
// node's GPU capacity visible to `kubectl describe node`, quotas and
// autoscalers, and lets kubelet reject pods that bypass the scheduler beyond
// capacity. Which card a container really gets is decided by the scheduler's
// assignment and applied at container creation (NRI), not by Allocate.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
)

// SocketName is the plugin's socket in kubelet's device-plugin directory.
const SocketName = "tessera-gpu.sock"

// Plugin is the device plugin server.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	// Dir is kubelet's device-plugin directory, holding kubelet.sock.
	Dir string
	// ResourceName is the advertised resource, e.g. tessera.io/gpu.
	ResourceName string
	// Split is the number of devices advertised per card.
	Split int
	// CheckInterval is how often kubelet's socket is checked for a restart.
	CheckInterval time.Duration

	mu      sync.Mutex
	cards   []discovery.Card
	changed chan struct{} // closed and replaced on every update
}

// Update replaces the advertised cards; open ListAndWatch streams resend.
func (p *Plugin) Update(cards []discovery.Card) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cards = append([]discovery.Card(nil), cards...)
	if p.changed != nil {
		close(p.changed)
	}
	p.changed = make(chan struct{})
}

// devices returns the advertised devices and a channel closed on the next
// update.
func (p *Plugin) devices() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	var devs []*pluginapi.Device
	for _, c := range p.cards {
		health := pluginapi.Healthy
		if !c.Healthy {
			health = pluginapi.Unhealthy
		}
		// No topology: the scheduler, not kubelet, chooses the cards, so a
		// NUMA hint would let kubelet's topology manager pin the
		// container's CPUs (and book units) beside a card it will not get;
		// with none the resource is "don't care" under every policy.
		for i := 0; i < p.Split; i++ {
			devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("%s::%d", c.UUID, i), Health: health})
		}
	}
	return devs, p.changed
}

// GetDevicePluginOptions reports no optional calls.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices now and after every update.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed := p.devices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate accepts kubelet's choice of devices without adding anything to
// the container: the cards and limits a container gets come from its
// assignment, applied at container creation.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

// Run serves the plugin and registers it with kubelet until ctx ends. When
// kubelet restarts (its socket is recreated, and it clears the directory),
// the plugin serves again and re-registers.
func (p *Plugin) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for {
		kubelet := filepath.Join(p.Dir, "kubelet.sock")
		seen, err := os.Stat(kubelet)
		if err != nil {
			logger.Info("Waiting for kubelet's device-plugin socket", "path", kubelet)
			if !p.wait(ctx) {
				return nil
			}
			continue
		}
		stop, err := p.serveAndRegister(ctx)
		if err != nil {
			logger.Error(err, "Device plugin registration failed; retrying")
			if !p.wait(ctx) {
				return nil
			}
			continue
		}
		logger.Info("Device plugin registered with kubelet", "resource", p.ResourceName, "split", p.Split)
		for restarted := false; !restarted; {
			if !p.wait(ctx) {
				stop()
				return nil
			}
			now, err := os.Stat(kubelet)
			restarted = err != nil || !os.SameFile(seen, now) || !now.ModTime().Equal(seen.ModTime())
		}
		logger.Info("Kubelet restarted; registering again")
		stop()
	}
}

func (p *Plugin) wait(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(p.CheckInterval):
		return true
	}
}

// serveAndRegister starts the gRPC server on the plugin's socket and
// registers with kubelet; stop shuts the server down.
func (p *Plugin) serveAndRegister(ctx context.Context) (stop func(), err error) {
	socket := filepath.Join(p.Dir, SocketName)
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(lis) }()
	stop = func() {
		server.Stop()
		_ = os.Remove(socket)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.Dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, err
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     SocketName,
		ResourceName: p.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		stop()
		return nil, fmt.Errorf("registering %s with kubelet: %w", p.ResourceName, err)
	}
	return stop, nil
}
