package enforce

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MIGCaps are the node's MIG capability device nodes (/dev/nvidia-caps/
// nvidia-cap<minor>), as the driver lists them: a container given a slice
// needs its slice's two (its GPU instance's and its compute instance's
// "access"), and must get no other — another slice's would let it in there,
// "config" and "monitor" manage and watch every slice.
type MIGCaps struct {
	// Major is the character major number of the capability nodes; -1 when
	// unknown (they are then recognised by path alone).
	Major int64
	// Minors maps a capability's name, e.g. "gpu0/gi1/ci0/access", to its
	// minor number.
	Minors map[string]int64
}

// Where the driver lists the capabilities and the character devices, and
// where their nodes are.
const (
	MIGMinorsPath = "/proc/driver/nvidia-caps/mig-minors"
	DevicesPath   = "/proc/devices"
	capsDir       = "/dev/nvidia-caps/"
)

// ReadMIGCaps reads the node's MIG capabilities from the driver's list
// (minorsPath, MIGMinorsPath on a node) and their major number from the
// kernel's device list (devicesPath).
func ReadMIGCaps(minorsPath, devicesPath string) (MIGCaps, error) {
	f, err := os.Open(minorsPath)
	if err != nil {
		return MIGCaps{}, fmt.Errorf("reading the MIG capabilities: %w", err)
	}
	defer f.Close()
	caps, err := parseMIGMinors(f)
	if err != nil {
		return MIGCaps{}, fmt.Errorf("%s: %w", minorsPath, err)
	}
	caps.Major = -1
	if raw, err := os.ReadFile(devicesPath); err == nil {
		caps.Major = charMajor(string(raw), "nvidia-caps")
	}
	return caps, nil
}

// parseMIGMinors reads lines "NAME MINOR", e.g. "gpu0/gi1/access 12".
func parseMIGMinors(r io.Reader) (MIGCaps, error) {
	caps := MIGCaps{Minors: map[string]int64{}}
	scanner := bufio.NewScanner(r)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 0 {
			continue
		}
		minor, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
		if len(fields) != 2 || err != nil || minor < 0 {
			return MIGCaps{}, fmt.Errorf("line %q: want NAME MINOR", scanner.Text())
		}
		caps.Minors[fields[0]] = minor
	}
	return caps, scanner.Err()
}

// charMajor finds name's character major number in /proc/devices' text;
// -1 when it is not listed.
func charMajor(devices, name string) int64 {
	inChar := false
	for _, line := range strings.Split(devices, "\n") {
		switch strings.TrimSpace(line) {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
		}
		fields := strings.Fields(line)
		if inChar && len(fields) == 2 && fields[1] == name {
			if major, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
				return major
			}
		}
	}
	return -1
}

// sliceCaps are the minors of the capabilities of the slice of a card whose
// device minor is gpuMinor: its GPU instance's and its compute instance's.
func (c MIGCaps) sliceCaps(gpuMinor, gpuInstance, computeInstance int) []int64 {
	var minors []int64
	for _, name := range []string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gpuInstance),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gpuInstance, computeInstance),
	} {
		if m, ok := c.Minors[name]; ok {
			minors = append(minors, m)
		}
	}
	return minors
}

// capNode reports whether d is a MIG capability node and the minor numbers
// it names: by its path (/dev/nvidia-caps/nvidia-cap<N>) and, where the
// major is known, by its numbers.
func (c MIGCaps) capNode(d DeviceNode) (minors []int64, isCap bool) {
	if n, ok := strings.CutPrefix(d.Path, capsDir); ok {
		isCap = true
		if m, err := strconv.ParseInt(strings.TrimPrefix(n, "nvidia-cap"), 10, 64); err == nil && m >= 0 {
			minors = append(minors, m)
		}
	}
	if c.Major >= 0 && d.Type == "c" && d.Major == c.Major {
		isCap = true
		if len(minors) == 0 || minors[0] != d.Minor {
			minors = append(minors, d.Minor)
		}
	}
	return minors, isCap
}
