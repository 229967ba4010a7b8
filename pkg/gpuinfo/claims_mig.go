package gpuinfo

import (
	"strconv"
	"strings"
)

// MIG slices as DRA devices: the names the node agent's DRA driver gives a
// card's slices, the counters a dynamic card's placements draw on, and the
// attributes a device class selects them by.
const (
	// DRAProfileAttribute is the attribute naming a slice device's MIG
	// profile ("1g.10gb"); only slice devices carry it.
	DRAProfileAttribute = "profile"
	// draSliceInfix separates a card's device name from its slice's:
	// "gpu-0-mig-1g10gb-6".
	draSliceInfix = "-mig-"
	// draSlotCounter starts the name of a dynamic card's memory slot
	// counter: "slot-3".
	draSlotCounter = "slot-"
)

// CreatableProfile reports whether Tessera creates slices of the profile on
// a dynamic card: the plain profiles ("3g.40gb"), not the variants with or
// without media extensions or graphics ("1g.10gb+me", "1g.10gb-me"), which
// only an operator asks for.
func CreatableProfile(profile string) bool { return !strings.ContainsAny(profile, "+-") }

// DRASliceDeviceName is the ResourceSlice device name of the MIG slice of
// profile at start on card i: "gpu-i-mig-PROFILE-START", the profile's name
// with all but its letters and digits left out and lowercased
// ("1g.10gb+me" gives "1g10gbme").
func DRASliceDeviceName(i int, profile string, start int) string {
	return DRADeviceName(i) + draSliceInfix + profileLabel(profile) + "-" + strconv.Itoa(start)
}

// profileLabel is a profile's name as a DNS label part.
func profileLabel(profile string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(profile) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// DRADeviceCard is the index of the card a device name of the driver's
// belongs to (the card's own or one of its slices'), and whether it names
// a slice.
func DRADeviceCard(device string) (index int, slice, ok bool) {
	card, _, isSlice := strings.Cut(device, draSliceInfix)
	index, ok = DRACardIndex(card)
	return index, isSlice, ok
}

// DRASliceOf returns the profile and start of the slice a device name
// names on card index of geometry mig: one of its instances', or on a
// dynamic card one of its placements' too. ok is false when it names none.
func DRASliceOf(device string, index int, mig *MIG, dynamic bool) (profile string, start int, ok bool) {
	if mig == nil {
		return "", 0, false
	}
	for _, in := range mig.Instances {
		if DRASliceDeviceName(index, in.Profile, in.Start) == device {
			return in.Profile, in.Start, true
		}
	}
	if !dynamic {
		return "", 0, false
	}
	for _, p := range mig.Profiles {
		for _, s := range p.Starts {
			if CreatableProfile(p.Name) && DRASliceDeviceName(index, p.Name, s) == device {
				return p.Name, s, true
			}
		}
	}
	return "", 0, false
}

// DRAMIGCounterSet is the name of the counter set of card i's memory slots
// (a dynamic card's), which the devices of its placements consume.
func DRAMIGCounterSet(i int) string { return DRADeviceName(i) + "-mig" }

// DRASlotCounter is the name of the counter of memory slot s.
func DRASlotCounter(s int) string { return draSlotCounter + strconv.Itoa(s) }
