package dra

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/node-agent/enforce"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// MIG slices as claim devices. A card in MIG mode is published as before
// (migEnabled, which Tessera's share classes exclude) and each of its
// slices as a device of its own, held whole by one claim: on a static card
// the slices the operator made; on a dynamic card every placement of a
// plain profile, each consuming the card's memory slots from a counter set
// of the card (partitionable devices), so kube-scheduler's allocator never
// gives out two placements that overlap. The driver creates a dynamic
// card's slice when it prepares a claim that holds it and destroys it when
// the claim is unprepared. A slice on a dynamic card that no claim of the
// driver made (the operator's, or one made for a pod before the node
// served claims) takes its slots out of the counters: no placement over it
// is offered.

// MIGBackend creates and destroys the slices of dynamic cards, and reads
// the cards again after.
type MIGBackend interface {
	discovery.MIGController
	Cards() ([]discovery.Card, error)
}

// sliceKey names a slice of the node: card index, profile and start slot.
type sliceKey struct {
	card    int
	profile string
	start   int
}

// sliceAnnotation is the CDI spec annotation that records the dynamic
// slices a claim's preparation made (so that a restarted agent knows whose
// they are): "CARD/PROFILE/START" entries separated by commas.
const sliceAnnotation = gpuinfo.Domain + "/mig-slices"

func (k sliceKey) String() string {
	return strconv.Itoa(k.card) + "/" + k.profile + "/" + strconv.Itoa(k.start)
}

// parseSliceKeys reads a sliceAnnotation.
func parseSliceKeys(s string) ([]sliceKey, error) {
	if s == "" {
		return nil, nil
	}
	var keys []sliceKey
	for _, entry := range strings.Split(s, ",") {
		parts := strings.Split(entry, "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("MIG slice %q: want CARD/PROFILE/START", entry)
		}
		card, err1 := strconv.Atoi(parts[0])
		start, err2 := strconv.Atoi(parts[2])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("MIG slice %q: %w", entry, err)
		}
		keys = append(keys, sliceKey{card, parts[1], start})
	}
	return keys, nil
}

// sliceDevice is one MIG slice device of a card, before it is published.
type sliceDevice struct {
	device  resourceapi.Device
	memory  int64
	slices  int
	made    bool // a slice that exists, not only a placement
	card    int
	start   int
	profile string
}

// migResources returns the slice devices of the cards in MIG mode, in the
// order kube-scheduler's allocator should try them (it takes the first
// that fits a request: smallest profile first, slices that exist before
// placements to cut, lower cards first, higher starts first so that small
// slices leave room for large ones), and the counter sets of the dynamic
// cards. owned holds the slices of dynamic cards that prepared claims made.
func migResources(cards []discovery.Card, owned map[sliceKey]types.UID, domains map[int]int) ([]resourceapi.Device, []resourceapi.CounterSet) {
	var (
		devices  []sliceDevice
		counters []resourceapi.CounterSet
	)
	for _, c := range sortedByIndex(cards) {
		if !c.MIGEnabled || c.MIG == nil {
			continue
		}
		if !c.MIGDynamic {
			for _, in := range c.MIG.Instances {
				if p := c.MIG.Profile(in.Profile); p != nil {
					devices = append(devices, newSliceDevice(c, p, in.Start, &in, nil, domains))
				}
			}
			continue
		}
		set := resourceapi.CounterSet{Name: gpuinfo.DRAMIGCounterSet(c.Index), Counters: map[string]resourceapi.Counter{}}
		for s := range c.MIG.Slots {
			set.Counters[gpuinfo.DRASlotCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
		for _, in := range c.MIG.Instances {
			if _, ok := owned[sliceKey{c.Index, in.Profile, in.Start}]; ok {
				continue
			}
			if p := c.MIG.Profile(in.Profile); p != nil {
				for s := in.Start; s < in.Start+p.Size; s++ {
					set.Counters[gpuinfo.DRASlotCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(0, resource.DecimalSI)}
				}
			}
		}
		counters = append(counters, set)
		for i := range c.MIG.Profiles {
			p := &c.MIG.Profiles[i]
			if !gpuinfo.CreatableProfile(p.Name) {
				continue
			}
			for _, start := range p.Starts {
				in, _ := c.Slice(p.Name, start)
				devices = append(devices, newSliceDevice(c, p, start, in, &set, domains))
			}
		}
	}
	slices.SortStableFunc(devices, func(a, b sliceDevice) int {
		return cmp.Or(cmp.Compare(a.memory, b.memory), cmp.Compare(a.slices, b.slices), cmp.Compare(a.profile, b.profile),
			compareBool(b.made, a.made), cmp.Compare(a.card, b.card), cmp.Compare(b.start, a.start))
	})
	out := make([]resourceapi.Device, len(devices))
	for i := range devices {
		out[i] = devices[i].device
	}
	return out, counters
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// newSliceDevice is the device of the slice of profile p at start on card
// c: in is the slice when it exists; set is the card's counter set when the
// card is dynamic (the device then consumes its slots).
func newSliceDevice(c discovery.Card, p *gpuinfo.MIGProfile, start int, in *gpuinfo.MIGInstance, set *resourceapi.CounterSet, domains map[int]int) sliceDevice {
	healthy := c.Healthy && (in == nil || in.Healthy)
	memory := *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI)
	dev := resourceapi.Device{
		Name: gpuinfo.DRASliceDeviceName(c.Index, p.Name, start),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"model":                     {StringValue: ptr.To(c.Model)},
			"parentUUID":                {StringValue: ptr.To(c.UUID)},
			"index":                     {IntValue: ptr.To(int64(c.Index))},
			"migEnabled":                {BoolValue: ptr.To(true)},
			"healthy":                   {BoolValue: ptr.To(healthy)},
			gpuinfo.DRAProfileAttribute: {StringValue: ptr.To(p.Name)},
			"migStart":                  {IntValue: ptr.To(int64(start))},
			"migSlices":                 {IntValue: ptr.To(int64(p.Slices))},
			"multiprocessors":           {IntValue: ptr.To(int64(p.Multiprocessors))},
			"dynamic":                   {BoolValue: ptr.To(set != nil)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			gpuinfo.DRAMemory: {Value: memory},
		},
	}
	if in != nil && set == nil {
		dev.Attributes["uuid"] = resourceapi.DeviceAttribute{StringValue: ptr.To(in.UUID)}
	}
	addTopology(dev.Attributes, c, domains)
	if set != nil {
		consumed := map[string]resourceapi.Counter{}
		for s := start; s < start+p.Size; s++ {
			consumed[gpuinfo.DRASlotCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
		dev.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: consumed}}
	}
	if !healthy {
		dev.Taints = []resourceapi.DeviceTaint{{Key: gpuinfo.DRAUnhealthyTaint, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return sliceDevice{device: dev, memory: p.MemoryMiB, slices: p.Slices, made: in != nil, card: c.Index, start: start, profile: p.Name}
}

// inChunks splits list into parts of at most n.
func inChunks[T any](list []T, n int) [][]T {
	var parts [][]T
	for len(list) > n {
		parts = append(parts, list[:n:n])
		list = list[n:]
	}
	if len(list) > 0 {
		parts = append(parts, list)
	}
	return parts
}

// slice returns the assignment entry and the MIG device of the slice a
// device names on card, making the slice first when the card is dynamic and
// it does not exist yet. made is the slice when it is the claim's to
// destroy on unprepare (made for it now or by an earlier preparation), nil
// on a static card; created says it was made now.
func (d *Driver) slice(claim types.UID, card discovery.Card, device string) (entry gpuinfo.CardAssignment, in gpuinfo.MIGInstance, made *sliceKey, created bool, err error) {
	profile, start, ok := gpuinfo.DRASliceOf(device, card.Index, card.MIG, card.MIGDynamic)
	if !ok {
		return entry, in, nil, false, fmt.Errorf("device %s is not a MIG slice of card %d (%s) as the card is now", device, card.Index, card.UUID)
	}
	key := sliceKey{card.Index, profile, start}
	instance, _ := card.Slice(profile, start)
	p := card.MIG.Profile(profile)
	if card.MIGDynamic {
		d.mu.Lock()
		owner, owned := d.owned[key]
		d.mu.Unlock()
		switch {
		case owned && owner != claim:
			return entry, in, nil, false, fmt.Errorf("MIG slice %s at slot %d of card %d is held by another claim (%s)", profile, start, card.Index, owner)
		case instance == nil:
			if instance, err = d.makeSlice(claim, key); err != nil {
				return entry, in, nil, false, err
			}
			created = true
		case !owned:
			// Made for this claim by a preparation that ended before it
			// recorded the slice (the agent stopped): the allocation holds
			// its slots, so no other claim can.
			d.setOwner(key, claim)
		}
		made = &key
	}
	if instance == nil {
		return entry, in, nil, false, fmt.Errorf("card %d (%s) has no MIG slice %s at slot %d now", card.Index, card.UUID, profile, start)
	}
	if !instance.Healthy {
		return entry, in, made, created, fmt.Errorf("MIG slice %s at slot %d of card %d (%s) is out of service", profile, start, card.Index, instance.UUID)
	}
	entry = enforce.SliceEntry(card, p, instance)
	return entry, *instance, made, created, nil
}

func (d *Driver) setOwner(key sliceKey, claim types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.owned == nil {
		d.owned = map[sliceKey]types.UID{}
	}
	d.owned[key] = claim
}

// makeSlice creates a dynamic card's slice for claim and returns its MIG
// device as the card has it then.
func (d *Driver) makeSlice(claim types.UID, key sliceKey) (*gpuinfo.MIGInstance, error) {
	if d.MIG == nil {
		return nil, fmt.Errorf("card %d is dynamic, but this driver cannot make MIG slices", key.card)
	}
	d.cutting.Lock()
	defer d.cutting.Unlock()
	// Owned before it exists: a scan meanwhile must not take its slots out
	// of the counters.
	d.setOwner(key, claim)
	if _, err := d.MIG.CreateMIGSlice(key.card, key.profile, key.start); err != nil {
		d.mu.Lock()
		delete(d.owned, key)
		d.mu.Unlock()
		return nil, fmt.Errorf("creating MIG slice %s at slot %d of card %d: %w", key.profile, key.start, key.card, err)
	}
	card, err := d.reread(key.card)
	if err != nil {
		return nil, fmt.Errorf("reading card %d after creating its MIG slice %s at slot %d: %w", key.card, key.profile, key.start, err)
	}
	in, _ := card.Slice(key.profile, key.start)
	if in == nil {
		return nil, fmt.Errorf("card %d shows no MIG slice %s at slot %d after creating it", key.card, key.profile, key.start)
	}
	if err := d.writeSliceSpec(); err != nil {
		err = fmt.Errorf("card %d, MIG slice %s at slot %d: writing its CDI spec: %w", key.card, key.profile, key.start, err)
		// Not handed over: made for nothing.
		return nil, errors.Join(err, d.destroyLocked(key))
	}
	return in, nil
}

// writeSliceSpec tells SliceSpec the cards as the driver has them now.
func (d *Driver) writeSliceSpec() error {
	if d.SliceSpec == nil {
		return nil
	}
	d.mu.Lock()
	cards := make([]discovery.Card, 0, len(d.cards))
	for _, c := range d.cards {
		cards = append(cards, c)
	}
	d.mu.Unlock()
	return d.SliceSpec(sortedByIndex(cards))
}

// unmakeSlices destroys the dynamic slices made for claim. A slice it
// cannot destroy stays the claim's, and the error says which.
func (d *Driver) unmakeSlices(claim types.UID) error {
	d.mu.Lock()
	var keys []sliceKey
	for k, owner := range d.owned {
		if owner == claim {
			keys = append(keys, k)
		}
	}
	d.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	if d.MIG == nil {
		return fmt.Errorf("claim %s holds MIG slices this driver cannot destroy", claim)
	}
	return d.destroySlices(keys)
}

// destroySlices destroys slices made for claims and forgets whose they
// were; one it cannot destroy is kept, and the error says which.
func (d *Driver) destroySlices(keys []sliceKey) error {
	d.cutting.Lock()
	defer d.cutting.Unlock()
	var errs []error
	for _, k := range keys {
		errs = append(errs, d.destroyLocked(k))
	}
	d.publish()
	if err := d.writeSliceSpec(); err != nil {
		errs = append(errs, fmt.Errorf("writing the CDI spec of the MIG slices: %w", err))
	}
	return errors.Join(errs...)
}

// destroyLocked destroys a slice made for a claim and forgets whose it was
// (a slice it cannot destroy stays the claim's); the caller holds cutting.
func (d *Driver) destroyLocked(k sliceKey) error {
	if err := d.MIG.DestroyMIGSlice(k.card, k.profile, k.start); err != nil {
		return fmt.Errorf("destroying MIG slice %s at slot %d of card %d: %w", k.profile, k.start, k.card, err)
	}
	d.mu.Lock()
	delete(d.owned, k)
	d.mu.Unlock()
	if _, err := d.reread(k.card); err != nil {
		return fmt.Errorf("reading card %d after destroying its MIG slice %s at slot %d: %w", k.card, k.profile, k.start, err)
	}
	return nil
}

// reread reads card index again from the backend after its slices changed
// and keeps it, with what the agent decided of it (dynamic, health).
func (d *Driver) reread(index int) (discovery.Card, error) {
	cards, err := d.MIG.Cards()
	if err != nil {
		return discovery.Card{}, err
	}
	for _, c := range cards {
		if c.Index != index {
			continue
		}
		name := gpuinfo.DRADeviceName(index)
		d.mu.Lock()
		defer d.mu.Unlock()
		if old, ok := d.cards[name]; ok {
			c.MIGDynamic, c.Healthy = old.MIGDynamic, old.Healthy
			d.cards[name] = c
		}
		return c, nil
	}
	return discovery.Card{}, fmt.Errorf("no card %d", index)
}

// loadOwned reads which claims made which slices from the claims' CDI specs
// (sliceAnnotation): after a restart, the slices of claims prepared before
// are still theirs.
func (d *Driver) loadOwned() error {
	matches, err := filepath.Glob(filepath.Join(d.CDIDir, gpuinfo.Domain+"-claim_*.json"))
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range matches {
		raw, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(raw, &spec); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		keys, err := parseSliceKeys(spec.Annotations[sliceAnnotation])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		claim := types.UID(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), gpuinfo.Domain+"-claim_"), ".json"))
		for _, k := range keys {
			d.setOwner(k, claim)
		}
	}
	return errors.Join(errs...)
}
