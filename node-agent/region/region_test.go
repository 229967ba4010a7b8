package region_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/tessera-gpu/tessera/internal/hamicore"
	"github.com/tessera-gpu/tessera/node-agent/region"
)

// The library's layout as testutil writes it, from the header's offsets.
const (
	libSize    = hamicore.RegionSize
	libLimit   = hamicore.RegionMemoryLimit
	libSMLimit = hamicore.RegionSMLimit
	libSlots   = hamicore.RegionSlots
	libProcNum = hamicore.RegionProcNum
	libSeqlock = hamicore.RegionSeqlock
)

type process = hamicore.RegionProcess

// libraryRegion writes a region initialised by the library and returns its
// path.
func libraryRegion(t *testing.T, major, minor uint32, mem, sm []uint64, procs []process) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctr.cache")
	if err := hamicore.WriteRegion(path, major, minor, mem, sm, procs); err != nil {
		t.Fatal(err)
	}
	return path
}

func open(t *testing.T, path string) *region.Region {
	t.Helper()
	r, err := region.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

const gib = 1 << 30

func TestSetLimitsWritesTheLibrarysFields(t *testing.T) {
	path := libraryRegion(t, 1, 2, []uint64{8 * gib, 8 * gib}, []uint64{30, 30}, nil)
	r := open(t, path)
	want := []region.Limits{{MemoryBytes: 12 * gib, ComputePercent: 40}, {MemoryBytes: 4 * gib, ComputePercent: 20}}
	if err := r.SetLimits(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	for i, l := range want {
		got := region.Limits{MemoryBytes: le.Uint64(raw[libLimit+8*i:]), ComputePercent: le.Uint64(raw[libSMLimit+8*i:])}
		if diff := cmp.Diff(l, got); diff != "" {
			t.Errorf("card %d in the file (-want,+got):\n%s", i, diff)
		}
	}
	if le.Uint64(raw[libLimit+16:]) != 0 || le.Uint64(raw[libSMLimit+16:]) != 0 {
		t.Error("a card beyond those given was written")
	}
	limits, err := r.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, limits[:2]); diff != "" {
		t.Errorf("Limits (-want,+got):\n%s", diff)
	}
}

func TestUsedSumsLiveProcesses(t *testing.T) {
	procs := []process{
		{PID: 41, Used: map[int]uint64{0: 3 * gib, 1: gib}},
		{PID: 0, Used: map[int]uint64{0: 5 * gib}}, // exited, slot not yet reclaimed
		{PID: 42, Used: map[int]uint64{0: gib, 15: 2 * gib}},
	}
	r := open(t, libraryRegion(t, 1, 2, nil, nil, procs))
	used, err := r.Used()
	if err != nil {
		t.Fatal(err)
	}
	var want [region.Devices]uint64
	want[0], want[1], want[15] = 4*gib, gib, 2*gib
	if diff := cmp.Diff(want, used); diff != "" {
		t.Errorf("Used (-want,+got):\n%s", diff)
	}
}

func TestRefusedRegions(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.cache")
	short := filepath.Join(dir, "short.cache")
	if err := os.WriteFile(empty, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, make([]byte, 4096), 0o666); err != nil {
		t.Fatal(err)
	}
	uninitialised := filepath.Join(dir, "zero.cache")
	if err := os.WriteFile(uninitialised, make([]byte, libSize+1), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := region.Open(empty); !errors.Is(err, region.ErrNotInitialised) {
		t.Errorf("an empty file: %v, want ErrNotInitialised", err)
	}
	if _, err := region.Open(short); err == nil || errors.Is(err, region.ErrNotInitialised) {
		t.Errorf("a 4 KiB file: %v, want an error of its size", err)
	}
	if err := open(t, uninitialised).SetLimits(context.Background(), []region.Limits{{MemoryBytes: gib}}); !errors.Is(err, region.ErrNotInitialised) {
		t.Errorf("a region without the flag: %v, want ErrNotInitialised", err)
	}
	for _, v := range [][2]uint32{{1, 1}, {2, 0}} {
		path := libraryRegion(t, v[0], v[1], []uint64{8 * gib}, nil, nil)
		err := open(t, path).SetLimits(context.Background(), []region.Limits{{MemoryBytes: gib}})
		var ve *region.VersionError
		if !errors.As(err, &ve) || ve.Major != v[0] || ve.Minor != v[1] {
			t.Errorf("version %d.%d: %v, want a VersionError", v[0], v[1], err)
		}
		raw, _ := os.ReadFile(path)
		if binary.LittleEndian.Uint64(raw[libLimit:]) != 8*gib {
			t.Errorf("version %d.%d: the limit was written anyway", v[0], v[1])
		}
	}
	if err := open(t, libraryRegion(t, 1, 2, nil, nil, nil)).SetLimits(context.Background(), make([]region.Limits, 17)); err == nil {
		t.Error("17 cards were accepted")
	}
}

// A container's processes can write anything into their region, hold its
// lock, or truncate it: each is an error, not a hang or a crash.
func TestHostileRegions(t *testing.T) {
	t.Run("process count beyond the slots", func(t *testing.T) {
		path := libraryRegion(t, 1, 2, nil, nil, nil)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], 5000)
		if _, err := f.WriteAt(n[:], libProcNum); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if _, err := open(t, path).Used(); err == nil {
			t.Error("5000 processes were read")
		}
	})
	t.Run("a slot written without end", func(t *testing.T) {
		path := libraryRegion(t, 1, 2, nil, nil, []process{{PID: 7, Used: map[int]uint64{0: gib}}})
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		var odd [8]byte
		binary.LittleEndian.PutUint64(odd[:], 5)
		if _, err := f.WriteAt(odd[:], libSlots+libSeqlock); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if _, err := open(t, path).Used(); err == nil {
			t.Error("a slot under a write that never ends was read")
		}
	})
	t.Run("lock held", func(t *testing.T) {
		path := libraryRegion(t, 1, 2, nil, nil, nil)
		// An open-file-description lock conflicts with the agent's record
		// lock as another process's lockf would.
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: libSize}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := open(t, path).SetLimits(ctx, []region.Limits{{MemoryBytes: gib}}); err == nil {
			t.Error("limits were written under the library's lock")
		}
	})
	t.Run("truncated after opening", func(t *testing.T) {
		path := libraryRegion(t, 1, 2, []uint64{8 * gib}, nil, nil)
		r := open(t, path)
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Limits(); err == nil {
			t.Error("a truncated region was read")
		}
		if err := r.SetLimits(context.Background(), []region.Limits{{MemoryBytes: gib}}); err == nil {
			t.Error("a truncated region was written")
		}
	})
}
