package enforce

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/node-agent/discovery"
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
// path /dev/nvidia<N>) not among its holdings' cards, or any other NVIDIA
// node (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/...) when it holds
// no card at all.
func CheckDevices(devices []DeviceNode, holdings []Holding, cards []discovery.Card) error {
	held := map[int]bool{}
	minors := map[int64]bool{}
	for _, h := range holdings {
		for _, c := range h.Cards {
			held[c.Index] = true
		}
	}
	for _, c := range cards {
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
	for _, d := range devices {
		if _, isGPU := gpuNode(d); isGPU && len(held) == 0 {
			return fmt.Errorf("the container would get the GPU device %s but was assigned no card: refusing it, whatever CDI device or annotation brought it", d.Path)
		}
	}
	return nil
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
