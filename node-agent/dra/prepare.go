package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// cdiKind is the CDI kind of the per-claim devices the driver writes.
const cdiKind = gpuinfo.Domain + "/claim"

// specPath is the file of the CDI spec the driver writes for a claim.
func (d *Driver) specPath(claim types.UID) string {
	return filepath.Join(d.CDIDir, gpuinfo.Domain+"-claim_"+string(claim)+".json")
}

// PrepareResourceClaims writes a CDI spec for each claim and returns the CDI
// devices of its cards on this node. A claim that cannot be prepared gets
// its reason (kubelet retries it and shows it on the pod).
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		if err != nil {
			err = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return out, nil
}

// UnprepareResourceClaims destroys the dynamic MIG slices made for the
// claims and removes their CDI specs and shared regions; a claim never prepared, or already unprepared, is not an error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		// The spec records the claim's slices: it goes once they are.
		if err := d.unmakeSlices(claim.UID); err != nil {
			out[claim.UID] = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
			continue
		}
		err := os.Remove(d.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[claim.UID] = errors.Join(err, d.Enforce.Paths.RemoveRegion(enforce.ClaimRegionName(claim.UID)))
	}
	return out, nil
}

// prepare writes claim's CDI spec: the spec's own edits are the claim's
// (visible cards, limits, mounts: applied once however many of its devices
// a container gets), and each card is a device of it.
func (d *Driver) prepare(claim *resourceapi.ResourceClaim) (_ []kubeletplugin.Device, err error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, errors.New("not allocated")
	}
	d.mu.Lock()
	cards := d.cards
	d.mu.Unlock()
	if cards == nil {
		return nil, errors.New("the node agent has not discovered this node's cards yet")
	}
	var (
		assigned []gpuinfo.CardAssignment
		slices   []enforce.SliceDevice
		devices  []kubeletplugin.Device
		params   *gpuinfo.DRAParameters
		made     []sliceKey
		created  []sliceKey
	)
	defer func() {
		// A preparation that fails leaves no slice it made behind: kubelet
		// may never unprepare a claim it could not prepare.
		if err != nil && len(created) > 0 {
			err = errors.Join(err, d.destroySlices(created))
		}
	}()
	for _, r := range alloc.Devices.Results {
		if r.Driver != gpuinfo.DRADriver || r.Pool != d.Node {
			continue
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return nil, fmt.Errorf("request %q: admin access to Tessera's cards is not supported: it would hand over a card others share, with no limit and outside the shares counted on it", r.Request)
		}
		index, isSlice, ok := gpuinfo.DRADeviceCard(r.Device)
		card, found := cards[gpuinfo.DRADeviceName(index)]
		if !ok || !found {
			return nil, fmt.Errorf("request %q: device %s is not a card of node %s", r.Request, r.Device, d.Node)
		}
		if !card.Healthy {
			return nil, fmt.Errorf("request %q: card %d (%s) is out of service", r.Request, card.Index, card.UUID)
		}
		p, err := parametersFor(alloc.Devices.Config, r.Request)
		if err != nil {
			return nil, fmt.Errorf("request %q: %w", r.Request, err)
		}
		if params != nil && *p != *params {
			return nil, fmt.Errorf("request %q: its parameters (%+v) differ from another request's (%+v): a claim's cards share one configuration", r.Request, *p, *params)
		}
		params = p
		if isSlice != (len(slices) > 0) && len(assigned) > 0 {
			return nil, fmt.Errorf("request %q: a claim holds either MIG slices or shares of cards, not both: ask for them in two claims", r.Request)
		}
		var share gpuinfo.CardAssignment
		if isSlice {
			entry, in, key, isNew, err := d.slice(claim.UID, card, r.Device)
			if isNew {
				created = append(created, *key)
			}
			if err != nil {
				return nil, fmt.Errorf("request %q: %w", r.Request, err)
			}
			if key != nil {
				made = append(made, *key)
			}
			share = entry
			slices = append(slices, enforce.SliceDevice{MIGInstance: in, Dynamic: card.MIGDynamic})
		} else {
			share = consumed(r, card)
			if p.Sharing == gpuinfo.SharingWhole && (share.MemoryMiB < card.MemoryMiB || share.Cores < gpuinfo.FullCores) {
				return nil, fmt.Errorf("request %q: sharing %s needs the whole card, but the allocation consumes %d of %d MiB and %d %% of compute on card %d", r.Request, gpuinfo.SharingWhole, share.MemoryMiB, card.MemoryMiB, share.Cores, card.Index)
			}
		}
		assigned = append(assigned, share)
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID,
			CDIDeviceIDs: []string{cdiKind + "=" + deviceName(claim.UID, r.Device)},
		})
	}
	if len(assigned) == 0 {
		return nil, nil
	}
	priority := "1"
	if params.TaskPriority == gpuinfo.TaskPriorityHigh {
		priority = "0"
	}
	// A MIG slice is fenced in hardware and held whole: no interception.
	whole := params.Sharing == gpuinfo.SharingWhole || len(slices) > 0
	adj := d.Enforce.Cards(assigned, slices, whole, enforce.ClaimRegionName(claim.UID), priority)
	if adj.Region != "" {
		if err := d.Enforce.Paths.CreateRegion(adj.Region); err != nil {
			return nil, err
		}
	}
	for i := range devices {
		if i < len(adj.CDIDevices) {
			devices[i].CDIDeviceIDs = append(devices[i].CDIDeviceIDs, adj.CDIDevices[i])
		}
	}
	if err := d.writeSpec(claim.UID, assigned, devices, adj, made); err != nil {
		return nil, err
	}
	return devices, nil
}

// consumed is the share of card an allocation result holds.
func consumed(r resourceapi.DeviceRequestAllocationResult, card discovery.Card) gpuinfo.CardAssignment {
	memory, cores := gpuinfo.DRAShare(r.ConsumedCapacity, gpuinfo.Card{MemoryMiB: card.MemoryMiB})
	return gpuinfo.CardAssignment{Index: card.Index, UUID: card.UUID, MemoryMiB: memory, Cores: cores}
}

// parametersFor are the driver parameters that apply to a request: the last
// of the allocation's configurations for this driver that names it or every
// request (the class's come first, then the claim's), or the defaults.
func parametersFor(configs []resourceapi.DeviceAllocationConfiguration, request string) (*gpuinfo.DRAParameters, error) {
	parent, _, _ := strings.Cut(request, "/")
	p := &gpuinfo.DRAParameters{APIVersion: gpuinfo.DRAParametersAPIVersion, Kind: gpuinfo.DRAParametersKind}
	for _, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuinfo.DRADriver {
			continue
		}
		if len(c.Requests) > 0 && !containsAny(c.Requests, request, parent) {
			continue
		}
		decoded, err := gpuinfo.DecodeDRAParameters(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("configuration from the %s: %w", strings.ToLower(string(c.Source)), err)
		}
		p = decoded
	}
	if p.Sharing == "" {
		p.Sharing = gpuinfo.SharingLimited
	}
	if p.TaskPriority == "" {
		p.TaskPriority = gpuinfo.TaskPriorityLow
	}
	return p, nil
}

func containsAny(list []string, a, b string) bool {
	for _, s := range list {
		if s == a || s == b {
			return true
		}
	}
	return false
}

// deviceName is the CDI device name of a claim's card.
func deviceName(claim types.UID, device string) string { return string(claim) + "-" + device }

// writeSpec writes the claim's CDI spec atomically (a runtime reading the
// directory never sees half a file).
func (d *Driver) writeSpec(claim types.UID, cards []gpuinfo.CardAssignment, devices []kubeletplugin.Device, adj *enforce.Adjustment, made []sliceKey) error {
	spec := &cdispec.Spec{Kind: cdiKind}
	if len(made) > 0 {
		keys := make([]string, len(made))
		for i, k := range made {
			keys[i] = k.String()
		}
		spec.Annotations = map[string]string{sliceAnnotation: strings.Join(keys, ",")}
	}
	// The claim's name on the node: containers holding cards through it
	// share its cards once (enforce.ClaimEnv).
	spec.ContainerEdits.Env = []string{enforce.ClaimEnv + "=" + string(claim)}
	for _, e := range adj.Env {
		spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, e.Name+"="+e.Value)
	}
	for _, m := range adj.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &cdispec.Mount{
			HostPath: m.Source, ContainerPath: m.Destination, Type: "bind", Options: []string{mode, "nosuid", "nodev", "rbind"},
		})
	}
	for i, c := range cards {
		uuid := c.UUID
		if c.MIG != nil {
			uuid = c.MIG.UUID
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: deviceName(claim, devices[i].DeviceName),
			ContainerEdits: cdispec.ContainerEdits{Env: []string{
				"TESSERA_CLAIM_GPU_" + strconv.Itoa(i) + "=" + uuid,
			}},
		})
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return err
	}
	spec.Version = version
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return enforce.WriteCDISpec(d.specPath(claim), raw)
}
