// Package hamicore writes and reads HAMi-core's shared region as the
// library lays it out, independently of the agent's node-agent/region: for
// tests, and for the simulated nodes of the demo, where no library runs to
// initialise a container's region.
package hamicore

import (
	"encoding/binary"
	"os"
)

// HAMi-core's shared region as its commit 8f3a89c lays it out on 64-bit
// Linux (docs/node-agent.md), written here from its header's offsets, not
// from node-agent/region's constants: the initialisation flag at 0, the
// version at 4 and 8, limit[16] (bytes) at 1600, sm_limit[16] (percent) at
// 1728, 1,024 process slots of 1,960 bytes from 1856 (pid at +0,
// used[d].total at +40+64d, seqlock at +1936), proc_num at 2,008,896;
// 2,008,952 bytes, and the library writes one byte more.
const (
	RegionSize        = 2008952
	RegionMemoryLimit = 1600
	RegionSMLimit     = 1728
	RegionSlots       = 1856
	RegionSlotSize    = 1960
	RegionProcNum     = 2008896
	RegionSlotUsed    = 40
	RegionUsedStride  = 64
	RegionSeqlock     = 1936
	regionMagic       = 19920718
)

// RegionProcess is a process slot of a region: its pid and memory use per
// card.
type RegionProcess struct {
	PID  uint32
	Used map[int]uint64
}

// WriteRegion writes at path a region the library initialised at version
// major.minor, with memory limits (bytes) and compute limits (percent) per
// card and the given process slots.
func WriteRegion(path string, major, minor uint32, memory, compute []uint64, procs []RegionProcess) error {
	b := make([]byte, RegionSize+1)
	le := binary.LittleEndian
	le.PutUint32(b[0:], regionMagic)
	le.PutUint32(b[4:], major)
	le.PutUint32(b[8:], minor)
	for i, v := range memory {
		le.PutUint64(b[RegionMemoryLimit+8*i:], v)
	}
	for i, v := range compute {
		le.PutUint64(b[RegionSMLimit+8*i:], v)
	}
	for s, p := range procs {
		slot := RegionSlots + s*RegionSlotSize
		le.PutUint32(b[slot:], p.PID)
		for d, u := range p.Used {
			le.PutUint64(b[slot+RegionSlotUsed+RegionUsedStride*d:], u)
		}
		le.PutUint64(b[slot+RegionSeqlock:], 4)
	}
	le.PutUint32(b[RegionProcNum:], uint32(len(procs)))
	return os.WriteFile(path, b, 0o666)
}

// RegionLimits reads card's memory (bytes) and compute (percent) limits
// from the region at path.
func RegionLimits(path string, card int) (memory, compute uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	le := binary.LittleEndian
	return le.Uint64(b[RegionMemoryLimit+8*card:]), le.Uint64(b[RegionSMLimit+8*card:]), nil
}
