package enforce

import (
	"fmt"
	"strconv"
	"strings"
)

// DeviceNode is a device node a container is created with, as the runtime's
// spec lists it.
type DeviceNode struct {
	Path         string
	Type         string // "c", "b", "u" or "p"
	Major, Minor int64
}

// nvidiaMajor is the character major number of NVIDIA's device nodes: a
// card is /dev/nvidia<minor>; 254 and 255 are /dev/nvidia-modeset and
// /dev/nvidiactl.
const nvidiaMajor = 195

// firstControlMinor is the first minor number of major 195 that is not a
// card.
const firstControlMinor = 254

// CheckDevices refuses a container whose device nodes (after every CDI
// device and annotation the runtime resolved, whatever name brought them)
// include a GPU it does not hold: a card's node (character 195:<minor>, or a
// path /dev/nvidia<N>) not among its holdings' cards (a MIG slice's card
// included), a MIG capability node (/dev/nvidia-caps/...) that is not its
// own slices' (node.MIGCaps lists them; none for a container without a
// slice), or any other NVIDIA node (/dev/nvidiactl, /dev/nvidia-uvm, ...)
// when it holds no card at all.
func CheckDevices(devices []DeviceNode, holdings []Holding, node Node) error {
	held := map[int]bool{}
	minors := map[int64]bool{}
	for _, h := range holdings {
		for _, c := range h.Cards {
			held[c.Index] = true
		}
	}
	for _, c := range node.Cards {
		if held[c.Index] && c.Minor >= 0 {
			minors[int64(c.Minor)] = true
		}
	}
	// Cards first: the refusal names the card a container would get.
	for _, d := range devices {
		cardMinors, _ := gpuNode(d)
		for _, m := range cardMinors {
			if !minors[m] {
				return fmt.Errorf("the container would get device %s (card minor %d), which is not a card it was assigned: refusing it, whatever CDI device or annotation brought it", d.Path, m)
			}
		}
	}
	if err := checkCaps(devices, holdings, node); err != nil {
		return err
	}
	for _, d := range devices {
		if _, isGPU := gpuNode(d); isGPU && len(held) == 0 {
			return fmt.Errorf("the container would get the GPU device %s but was assigned no card: refusing it, whatever CDI device or annotation brought it", d.Path)
		}
	}
	return nil
}

// checkCaps refuses MIG capability nodes other than those of the slices the
// holdings give. The node's capabilities are read only for a container that
// has such a node by path or holds a slice (a node elsewhere is known by its
// major number); without them, none is allowed.
func checkCaps(devices []DeviceNode, holdings []Holding, node Node) error {
	caps := MIGCaps{Major: -1}
	byPath := hasPathPrefix(devices, capsDir)
	if node.MIGCaps != nil && (byPath || holdsSlice(holdings)) {
		read, err := node.MIGCaps()
		switch {
		case err == nil:
			caps = read
		case byPath:
			return fmt.Errorf("the container would get MIG capability devices, and %v: refusing them", err)
		}
	}
	var allowed map[int64]bool
	for _, d := range devices {
		capMinors, isCap := caps.capNode(d)
		if !isCap {
			continue
		}
		if len(capMinors) == 0 {
			return fmt.Errorf("the container would get MIG capability device %s, which names no capability: refusing it", d.Path)
		}
		if allowed == nil {
			allowed = sliceCapMinors(caps, holdings, node)
		}
		for _, m := range capMinors {
			if !allowed[m] {
				return fmt.Errorf("the container would get MIG capability device %s (minor %d), which is not one of its own MIG slices': refusing it, whatever CDI device or annotation brought it", d.Path, m)
			}
		}
	}
	return nil
}

// sliceCapMinors are the capability minors of the slices the holdings give.
func sliceCapMinors(caps MIGCaps, holdings []Holding, node Node) map[int64]bool {
	allowed := map[int64]bool{}
	for _, h := range holdings {
		for _, e := range h.Cards {
			if e.MIG == nil {
				continue
			}
			card, ok := node.card(e.Index)
			if !ok || card.Minor < 0 {
				continue
			}
			if in, _ := card.Slice(e.MIG.Profile, e.MIG.Start); in != nil {
				for _, m := range caps.sliceCaps(card.Minor, in.GPUInstance, in.ComputeInstance) {
					allowed[m] = true
				}
			}
		}
	}
	return allowed
}

// holdsSlice reports whether the holdings give a MIG slice.
func holdsSlice(holdings []Holding) bool {
	for _, h := range holdings {
		for _, e := range h.Cards {
			if e.MIG != nil {
				return true
			}
		}
	}
	return false
}

// hasPathPrefix reports whether a device node's path starts with prefix.
func hasPathPrefix(devices []DeviceNode, prefix string) bool {
	for _, d := range devices {
		if strings.HasPrefix(d.Path, prefix) {
			return true
		}
	}
	return false
}

// gpuNode classifies a device node: whether it is NVIDIA's, and the minor
// numbers of the cards it names — by its path (/dev/nvidia<N>) and by its
// numbers (character 195:<N>, N below 254); a node whose path and numbers
// disagree names both cards.
func gpuNode(d DeviceNode) (cardMinors []int64, isGPU bool) {
	if n, ok := strings.CutPrefix(d.Path, "/dev/nvidia"); ok {
		isGPU = true
		if m, err := strconv.ParseInt(n, 10, 64); err == nil && m >= 0 {
			cardMinors = append(cardMinors, m)
		}
	}
	if d.Type == "c" && d.Major == nvidiaMajor {
		isGPU = true
		if d.Minor < firstControlMinor && (len(cardMinors) == 0 || cardMinors[0] != d.Minor) {
			cardMinors = append(cardMinors, d.Minor)
		}
	}
	return cardMinors, isGPU
}
