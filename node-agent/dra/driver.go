// Package dra is the node agent's DRA driver (Dynamic Resource Allocation,
// resource.k8s.io/v1): it publishes the node's cards as ResourceSlice devices
// that many claims can share, each consuming part of the card's memory and
// compute (consumable capacity), and prepares allocated claims for kubelet
// by writing a CDI spec per claim with exactly what the NRI path applies to
// an extended-resource container: the visible cards, the interception
// library's limits, and its library and preload mounts.
//
// A node serves its cards through either this driver or the extended-resource
// API (device plugin and inventory annotation), never both, so that no card
// is counted twice.
package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// Driver is the DRA driver of one node.
type Driver struct {
	// Node is this node's name; it is also the name of the driver's pool.
	Node string
	// Enforce says how cards are handed over (the interception library's
	// paths, the toolkit's CDI devices), as for the NRI path.
	Enforce enforce.Config
	// CDIDir is where the per-claim CDI specs are written (the runtime's
	// CDI spec directory, /var/run/cdi).
	CDIDir string

	// MIG, when set, creates and destroys the slices of the dynamic cards
	// (discovery.Card.MIGDynamic) as prepared claims hold them; without it
	// a dynamic card offers no placements.
	MIG MIGBackend
	// SliceSpec, when set, is told the cards after the driver made or
	// destroyed a slice, before the claim's preparation returns: the CDI
	// spec of the dynamic cards' slices (enforce.MIGSpecWriter.Write)
	// must name a slice before a container is given it.
	SliceSpec func(cards []discovery.Card) error

	mu sync.Mutex
	// cards are the last scan's cards by device name.
	cards map[string]discovery.Card
	// owned are the dynamic cards' slices that prepared claims made, and
	// the claim of each.
	owned map[sliceKey]types.UID
	// cutting serialises the making and unmaking of slices.
	cutting sync.Mutex
	// published is what was last handed to the helper.
	published *resourceslice.DriverResources
	helper    *kubeletplugin.Helper
	ctx       context.Context
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Options are where kubelet expects the driver.
type Options struct {
	// PluginDataDir holds the driver's socket (/var/lib/kubelet/plugins/tessera.io).
	PluginDataDir string
	// RegistrarDir is kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry).
	RegistrarDir string
}

// Start serves the driver to kubelet and publishes the cards known so far;
// later scans republish through Update. It returns once serving; the
// driver stops when ctx ends.
func (d *Driver) Start(ctx context.Context, client kubernetes.Interface, o Options) error {
	if err := os.MkdirAll(o.PluginDataDir, 0o750); err != nil {
		return fmt.Errorf("the DRA driver's directory: %w", err)
	}
	if err := d.loadOwned(); err != nil {
		// Those claims' slices take their slots out of the counters
		// until unprepared by hand; the rest of the node is served.
		klog.FromContext(ctx).Error(err, "Reading which prepared claims hold MIG slices", "dir", d.CDIDir)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(gpuinfo.DRADriver),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(d.Node),
		kubeletplugin.PluginDataDirectoryPath(o.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(o.RegistrarDir),
		// Card health is published as device taints, which keep new
		// claims off a failing card.
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("starting the DRA driver: %w", err)
	}
	d.mu.Lock()
	d.helper, d.ctx = helper, ctx
	d.mu.Unlock()
	go func() {
		<-ctx.Done()
		helper.Stop()
	}()
	d.publish()
	return nil
}

// Update takes the cards of a scan and republishes the node's devices when
// they changed (a card added, removed, or its health changed).
func (d *Driver) Update(cards []discovery.Card) {
	byName := make(map[string]discovery.Card, len(cards))
	for _, c := range cards {
		byName[gpuinfo.DRADeviceName(c.Index)] = c
	}
	d.mu.Lock()
	d.cards = byName
	d.mu.Unlock()
	d.publish()
}

// publish hands the current devices to the helper when they differ from
// what it last got; the helper's controller writes the ResourceSlice.
func (d *Driver) publish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.helper == nil || d.cards == nil {
		return
	}
	cards := make([]discovery.Card, 0, len(d.cards))
	for _, c := range d.cards {
		cards = append(cards, c)
	}
	res := resources(d.Node, cards, d.owned)
	if d.published != nil && equality.Semantic.DeepEqual(*d.published, res) {
		return
	}
	if err := d.helper.PublishResources(d.ctx, res); err != nil {
		klog.FromContext(d.ctx).Error(err, "Publishing the node's cards as ResourceSlice devices", "node", d.Node)
		return
	}
	d.published = &res
}

// resources are the node's cards as one pool, named after the node: a
// device per card (by index), shareable by many claims, each consuming
// memory (whole MiB, up to the card's) and compute (whole percent, up to
// 100) — the ranges Tessera's extended resources accept. A request that
// names neither gets the whole card. A card out of service is tainted
// NoSchedule. The slices of cards in MIG mode follow (migResources), with
// the dynamic cards' counter sets in slices of their own; a pool without
// MIG is one slice.
func resources(node string, cards []discovery.Card, owned map[sliceKey]types.UID) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(cards))
	domains := nvlinkDomains(cards)
	for _, c := range sortedByIndex(cards) {
		memory := *resource.NewQuantity(c.MemoryMiB<<20, resource.BinarySI)
		cores := *resource.NewQuantity(gpuinfo.FullCores, resource.DecimalSI)
		dev := resourceapi.Device{
			Name: gpuinfo.DRADeviceName(c.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model":      {StringValue: ptr.To(c.Model)},
				"uuid":       {StringValue: ptr.To(c.UUID)},
				"index":      {IntValue: ptr.To(int64(c.Index))},
				"migEnabled": {BoolValue: ptr.To(c.MIGEnabled)},
				"healthy":    {BoolValue: ptr.To(c.Healthy)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				gpuinfo.DRAMemory: {Value: memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(memory),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Mi")), Max: ptr.To(memory), Step: ptr.To(resource.MustParse("1Mi"))},
				}},
				gpuinfo.DRACores: {Value: cores, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(cores),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Max: ptr.To(cores), Step: ptr.To(resource.MustParse("1"))},
				}},
			},
			AllowMultipleAllocations: ptr.To(true),
		}
		addTopology(dev.Attributes, c, domains)
		if !c.Healthy {
			dev.Taints = []resourceapi.DeviceTaint{{Key: gpuinfo.DRAUnhealthyTaint, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		devices = append(devices, dev)
	}
	sliceDevices, counters := migResources(cards, owned, domains)
	if len(sliceDevices) == 0 {
		return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			node: {Slices: []resourceslice.Slice{{Devices: devices}}},
		}}
	}
	var pool resourceslice.Pool
	for _, part := range inChunks(append(devices, sliceDevices...), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: part})
	}
	for _, part := range inChunks(counters, resourceapi.ResourceSliceMaxCounterSets) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{SharedCounters: part})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}
}

// sortedByIndex copies cards in index order.
func sortedByIndex(cards []discovery.Card) []discovery.Card {
	out := slices.Clone(cards)
	slices.SortFunc(out, func(a, b discovery.Card) int { return cmp.Compare(a.Index, b.Index) })
	return out
}

// HandleError logs background errors (publishing slices); the helper retries
// recoverable ones. An unrecoverable one stops nothing else on the node: the
// agent logs it and keeps heartbeating.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg, "driver", gpuinfo.DRADriver, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// WatchHealthStatus is not served (Start turns the service off): health
// travels as device taints.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
