package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
)

// MIGSpecKind is the CDI kind of the slices of the dynamic cards, in the
// spec the agent writes (MIGSpecWriter).
const MIGSpecKind = gpuinfo.Domain + "/mig"

// migSpecFile is the name of that spec in the runtime's CDI directory.
const migSpecFile = gpuinfo.Domain + "-mig.json"

// migDeviceName is the CDI device name of MIG device index of card card,
// as the NVIDIA toolkit names it: "CARD:INDEX".
func migDeviceName(card, index int) string { return strconv.Itoa(card) + ":" + strconv.Itoa(index) }

// MIGSpecWriter keeps a CDI spec of the MIG slices of the node's dynamic
// cards current: the NVIDIA toolkit's spec (nvidia-ctk cdi generate) names
// the MIG devices there were when it was generated, so a slice Tessera
// makes later is not in it, and the runtime would refuse a container given
// it. Each slice is a device "CARD:INDEX" of MIGSpecKind with the card's
// device node and the slice's two capability nodes; the spec carries the
// toolkit spec's common edits (the driver's libraries, its hooks, the
// control devices), so a container gets what the toolkit's own MIG device
// would give it.
type MIGSpecWriter struct {
	// Dir is the runtime's CDI spec directory, where the spec is written.
	Dir string
	// ToolkitKind is the kind of the NVIDIA toolkit's spec (Config.CDIKind),
	// read from ToolkitDirs.
	ToolkitKind string
	ToolkitDirs []string
	// Caps reads the node's MIG capability devices.
	Caps func() (MIGCaps, error)

	mu sync.Mutex
	// written is the spec last written ("" when none is).
	written string
}

// Write writes the spec of the dynamic cards' slices among cards when it
// changed, or removes it when there are none.
func (w *MIGSpecWriter) Write(cards []discovery.Card) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	spec, err := w.spec(cards)
	if err != nil {
		return err
	}
	path := filepath.Join(w.Dir, migSpecFile)
	if spec == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		w.written = ""
		return nil
	}
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if string(raw) == w.written {
		return nil
	}
	if err := WriteCDISpec(path, raw); err != nil {
		return err
	}
	w.written = string(raw)
	return nil
}

// spec is the spec of the dynamic cards' slices; nil when there are none.
func (w *MIGSpecWriter) spec(cards []discovery.Card) (*cdispec.Spec, error) {
	var dynamic []discovery.Card
	for _, c := range cards {
		if c.MIGDynamic && c.MIG != nil && len(c.MIG.Instances) > 0 {
			dynamic = append(dynamic, c)
		}
	}
	if len(dynamic) == 0 {
		return nil, nil
	}
	caps, err := w.Caps()
	if err != nil {
		return nil, err
	}
	spec := &cdispec.Spec{Kind: MIGSpecKind}
	if common, err := w.toolkitEdits(); err != nil {
		return nil, err
	} else if common != nil {
		spec.ContainerEdits = *common
	}
	for _, c := range dynamic {
		for _, in := range c.MIG.Instances {
			minors := caps.sliceCaps(c.Minor, in.GPUInstance, in.ComputeInstance)
			if len(minors) != 2 {
				return nil, fmt.Errorf("card %d, MIG slice %s at slot %d (GPU instance %d, compute instance %d): the driver lists %d of its 2 capability devices", c.Index, in.Profile, in.Start, in.GPUInstance, in.ComputeInstance, len(minors))
			}
			nodes := []*cdispec.DeviceNode{{Path: "/dev/nvidia" + strconv.Itoa(c.Minor)}}
			for _, m := range minors {
				nodes = append(nodes, &cdispec.DeviceNode{Path: capsDir + "nvidia-cap" + strconv.FormatInt(m, 10)})
			}
			spec.Devices = append(spec.Devices, cdispec.Device{
				Name:           migDeviceName(c.Index, in.Index),
				ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes},
			})
		}
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = version
	return spec, nil
}

// toolkitEdits are the common edits of the toolkit's spec of ToolkitKind;
// nil when there is none.
func (w *MIGSpecWriter) toolkitEdits() (*cdispec.ContainerEdits, error) {
	if w.ToolkitKind == "" || len(w.ToolkitDirs) == 0 {
		return nil, nil
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(w.ToolkitDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	vendor, class, _ := strings.Cut(w.ToolkitKind, "/")
	for _, s := range cache.GetVendorSpecs(vendor) {
		if s.GetClass() == class && filepath.Base(s.GetPath()) != migSpecFile {
			edits := s.ContainerEdits
			return &edits, nil
		}
	}
	return nil, nil
}

// WriteCDISpec writes a CDI spec to path atomically: a runtime reading the
// directory never sees half a file.
func WriteCDISpec(path string, raw []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+gpuinfo.Domain+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
