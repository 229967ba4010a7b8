package discovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// BoundedStats reads a backend's live statistics within a timeout, one
// reading at a time: a reading that outlives its caller is never joined by
// another, so a hung driver costs one goroutine, not one per caller. The
// agent's metrics and its over-use detection share one.
type BoundedStats struct {
	reader  StatsReader
	timeout time.Duration
	// token is held while a reading runs.
	token chan struct{}
}

// ErrReadingInProgress is Read's error while an earlier reading has not
// returned.
var ErrReadingInProgress = errors.New("the previous reading has not finished")

// NewBoundedStats bounds backend's readings by timeout; nil when the backend
// reads no statistics.
func NewBoundedStats(backend Backend, timeout time.Duration) *BoundedStats {
	reader, ok := backend.(StatsReader)
	if !ok {
		return nil
	}
	return &BoundedStats{reader: reader, timeout: timeout, token: make(chan struct{}, 1)}
}

// Read returns what the backend could read and, joined, the errors of what
// it could not; no statistics when a reading is already running, the
// backend panicked or it did not answer within the timeout (the reading
// goes on, and no other starts until it ends).
func (b *BoundedStats) Read() ([]CardStats, error) {
	select {
	case b.token <- struct{}{}:
	default:
		return nil, ErrReadingInProgress
	}
	type result struct {
		stats []CardStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-b.token }()
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("reading GPU statistics panicked: %v", r)}
			}
		}()
		stats, err := b.reader.Stats()
		done <- result{stats, err}
	}()
	timer := time.NewTimer(b.timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.stats, r.err
	case <-timer.C:
		return nil, fmt.Errorf("the backend did not answer within %v", b.timeout)
	}
}

// ContainerOfProcess returns the ID of the container whose cgroup holds
// process pid, among the IDs known accepts, from procRoot/<pid>/cgroup; ""
// for none (or a process gone). The runtimes put the container's ID in the
// cgroup's path, whatever the cgroup driver: ".../cri-containerd-<id>.scope"
// (systemd), ".../pod<uid>/<id>" (cgroupfs), ".../crio-<id>.scope" (CRI-O).
func ContainerOfProcess(procRoot string, pid uint32, known func(id string) bool) string {
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return ""
	}
	for _, word := range strings.FieldsFunc(string(raw), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if known(word) {
			return word
		}
	}
	return ""
}
