// Package region reads and writes the shared region of HAMi-core's CUDA
// interception library: the file, one per container, in which the
// library's processes keep their per-card limits and memory use. The agent
// writes a resized share's limits there; a running process reads its memory
// limit from the region on every allocation and its compute limit once, when
// it starts.
//
// Only the layout of the HAMi-core version the agent supports is read or
// written (docs/node-agent.md): version 1.2 at commit 8f3a89c. A region of
// another version is refused, never guessed at. The region is writable by
// the container's own processes, so nothing read from it is trusted beyond
// its bounds: a truncated file, a lock held forever or an absurd process
// count each give an error, never a crash or a hang.
package region

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The layout of shared_region_t (src/multiprocess/multiprocess_memory_limit.h
// at HAMi-core 8f3a89c, 64-bit Linux with glibc; checked with gcc's offsetof
// on x86_64): offsets in bytes.
const (
	// Size is the size of the region the library maps.
	Size = 2008952
	// Devices is how many cards a region has limits for.
	Devices = 16
	// MaxProcesses is how many process slots a region has.
	MaxProcesses = 1024

	magic            = 19920718
	majorVersion     = 1
	minorVersion     = 2
	offMajor         = 4
	offMinor         = 8
	offMemoryLimit   = 1600 // uint64 bytes per card
	offComputeLimit  = 1728 // uint64 percent per card
	offSlots         = 1856
	slotSize         = 1960
	offSlotPID       = 0
	offSlotUsed      = 8 // 16 device_memory_t of 64 bytes; total at +32
	usedStride       = 64
	offUsedTotal     = 32
	offSlotSeqlock   = 1936
	offProcessCount  = 2008896
	lockPollInterval = 10 * time.Millisecond
)

// ErrNotInitialised is returned for a region no process of the container
// has initialised yet: the first one to load the library will fill it from
// its environment.
var ErrNotInitialised = errors.New("the shared region is not initialised yet (no process of the container has loaded the interception library)")

// VersionError is returned for a region of a layout the agent does not
// know.
type VersionError struct {
	Major, Minor uint32
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("the shared region has layout version %d.%d; the agent supports %d.%d only (HAMi-core 8f3a89c)", e.Major, e.Minor, majorVersion, minorVersion)
}

// Limits are one card's limits in a region.
type Limits struct {
	// MemoryBytes is the memory limit; 0 means none.
	MemoryBytes uint64
	// ComputePercent is the compute limit; 0 or 100 and above mean none.
	ComputePercent uint64
}

// Region is an open shared region.
type Region struct {
	path string
	file *os.File
	data []byte
}

// Open opens the region file at path for reading and writing. A file
// shorter than Size is a region not yet initialised when empty (the agent
// creates it so), and an error otherwise.
func Open(path string) (*Region, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the shared region: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("reading the shared region %s: %w", path, err)
	}
	switch {
	case !st.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("the shared region %s is not a regular file", path)
	case st.Size() == 0:
		f.Close()
		return nil, ErrNotInitialised
	case st.Size() < Size:
		f.Close()
		return nil, fmt.Errorf("the shared region %s is %d bytes, shorter than the %d of its layout", path, st.Size(), Size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mapping the shared region %s: %w", path, err)
	}
	return &Region{path: path, file: f, data: data}, nil
}

// Close unmaps and closes the region.
func (r *Region) Close() error {
	return errors.Join(unix.Munmap(r.data), r.file.Close())
}

// word is the uint64 at off, for atomic access: the library's processes
// read and write the region concurrently.
func (r *Region) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.data[off])) }

// word32 is the uint32 at off.
func (r *Region) word32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.data[off])) }

// guard runs f, turning a fault on the mapping (the container truncated the
// file after it was mapped) into an error.
func (r *Region) guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the shared region %s changed size while being read: %v", r.path, p)
		}
	}()
	return f()
}

// lock takes the lock the library holds while it initialises the region
// (lockf on its bytes), waiting until ctx is done: a process of the
// container could hold it forever.
func (r *Region) lock(ctx context.Context) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: Size}
	for {
		err := unix.FcntlFlock(r.file.Fd(), unix.F_SETLK, &lk)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			return fmt.Errorf("locking the shared region %s: %w", r.path, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("locking the shared region %s: a process of the container holds it: %w", r.path, context.Cause(ctx))
		case <-time.After(lockPollInterval):
		}
	}
}

func (r *Region) unlock() {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: 0, Len: Size}
	_ = unix.FcntlFlock(r.file.Fd(), unix.F_SETLK, &lk)
}

// check returns ErrNotInitialised or a *VersionError unless the region is
// initialised with the supported layout.
func (r *Region) check() error {
	if atomic.LoadUint32(r.word32(0)) != magic {
		return ErrNotInitialised
	}
	if major, minor := atomic.LoadUint32(r.word32(offMajor)), atomic.LoadUint32(r.word32(offMinor)); major != majorVersion || minor != minorVersion {
		return &VersionError{Major: major, Minor: minor}
	}
	return nil
}

// Limits returns the limits of the region's cards 0..Devices-1 (the
// container's own card indices).
func (r *Region) Limits() (limits [Devices]Limits, err error) {
	err = r.guard(func() error {
		if err := r.check(); err != nil {
			return err
		}
		for i := range limits {
			limits[i] = Limits{
				MemoryBytes:    atomic.LoadUint64(r.word(offMemoryLimit + 8*i)),
				ComputePercent: atomic.LoadUint64(r.word(offComputeLimit + 8*i)),
			}
		}
		return nil
	})
	return limits, err
}

// SetLimits writes the limits of the container's cards 0..len(limits)-1,
// holding the library's initialisation lock so that a process initialising
// the region cannot overwrite them, and reads them back. It refuses a region
// not initialised or of another layout, and more cards than a region has.
func (r *Region) SetLimits(ctx context.Context, limits []Limits) error {
	if len(limits) > Devices {
		return fmt.Errorf("a shared region has limits for %d cards, not %d", Devices, len(limits))
	}
	if err := r.lock(ctx); err != nil {
		return err
	}
	defer r.unlock()
	return r.guard(func() error {
		if err := r.check(); err != nil {
			return err
		}
		for i, l := range limits {
			atomic.StoreUint64(r.word(offMemoryLimit+8*i), l.MemoryBytes)
			atomic.StoreUint64(r.word(offComputeLimit+8*i), l.ComputePercent)
		}
		for i, l := range limits {
			got := Limits{MemoryBytes: atomic.LoadUint64(r.word(offMemoryLimit + 8*i)), ComputePercent: atomic.LoadUint64(r.word(offComputeLimit + 8*i))}
			if got != l {
				return fmt.Errorf("the shared region %s holds %+v for card %d after %+v was written", r.path, got, i, l)
			}
		}
		return nil
	})
}

// Used returns the memory in bytes the container's live processes hold on
// each of its cards, as they record it in the region: the sum over process
// slots with a process in them. A process count beyond the region's slots is
// an error (the region is the container's to scribble on).
func (r *Region) Used() (used [Devices]uint64, err error) {
	err = r.guard(func() error {
		if err := r.check(); err != nil {
			return err
		}
		n := int(int32(atomic.LoadUint32(r.word32(offProcessCount))))
		if n < 0 || n > MaxProcesses {
			return fmt.Errorf("the shared region %s counts %d processes, beyond its %d slots", r.path, n, MaxProcesses)
		}
		for s := 0; s < n; s++ {
			slot := offSlots + s*slotSize
			if atomic.LoadUint32(r.word32(slot+offSlotPID)) == 0 {
				continue
			}
			devices, ok := r.readSlot(slot)
			if !ok {
				return fmt.Errorf("the shared region %s: process slot %d is being written without end", r.path, s)
			}
			for d := range used {
				used[d] += devices[d]
			}
		}
		return nil
	})
	return used, err
}

// A slot read under its seqlock is retried readSlotTries times, waiting
// slotRetryInterval while a write is under way (a write takes microseconds).
const (
	readSlotTries     = 50
	slotRetryInterval = time.Millisecond
)

// readSlot reads a slot's memory use per card consistently: the library
// makes its sequence number odd while it writes and even again after.
func (r *Region) readSlot(slot int) (devices [Devices]uint64, ok bool) {
	seq := r.word(slot + offSlotSeqlock)
	for try := 0; try < readSlotTries; try++ {
		before := atomic.LoadUint64(seq)
		if before%2 == 1 {
			time.Sleep(slotRetryInterval)
			continue
		}
		for d := range devices {
			devices[d] = atomic.LoadUint64(r.word(slot + offSlotUsed + d*usedStride + offUsedTotal))
		}
		if atomic.LoadUint64(seq) == before {
			return devices, true
		}
	}
	return devices, false
}
