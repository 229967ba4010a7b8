package discovery

import (
	"errors"
	"fmt"
	"time"
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
