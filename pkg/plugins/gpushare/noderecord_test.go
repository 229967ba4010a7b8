package gpushare

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestNodeRecords(t *testing.T) {
	var r nodeRecords
	if r.get("n") != nil {
		t.Fatal("a record exists before any handler made one")
	}
	rec := r.ensure("n")
	if r.ensure("n") != rec {
		t.Fatal("ensure made a second record for the same node")
	}

	cycle := r.newCycle()
	rec.storeScore(cycle, 73)
	if got, ok := rec.loadScore(cycle); !ok || got != 73 {
		t.Errorf("loadScore(this cycle) = %d, %v; want 73, true", got, ok)
	}
	if _, ok := rec.loadScore(r.newCycle()); ok {
		t.Error("a later cycle read an earlier cycle's score")
	}

	renewed := time.Now().Add(-time.Minute)
	rec.renewed.Store(renewed.UnixNano())
	if !rec.silentSince(time.Now().Add(-time.Second).UnixNano()) {
		t.Error("an agent a minute silent is not silent for a one-second timeout")
	}
	if rec.silentSince(time.Now().Add(-time.Hour).UnixNano()) {
		t.Error("an agent a minute silent is silent for a one-hour timeout")
	}
	if (&nodeRecord{}).silentSince(time.Now().UnixNano()) {
		t.Error("a node without a Lease is silent")
	}

	// A deleted node keeps its agent's heartbeat (a node re-created under
	// the same name is still kept off while its agent is silent), not the
	// caches.
	r.nodeDeleted("n")
	if rec := r.get("n"); rec == nil || rec.renewed.Load() != renewed.UnixNano() {
		t.Fatalf("deleting the node dropped its agent's heartbeat: %+v", rec)
	}
	if _, ok := rec.loadScore(cycle); ok {
		t.Error("deleting the node kept its score slot")
	}
	if hbs := r.heartbeats(); len(hbs) != 1 || hbs[0].node != "n" || !hbs[0].renewed.Equal(time.Unix(0, renewed.UnixNano())) {
		t.Errorf("heartbeats() = %+v, want n's", hbs)
	}
	r.leaseDeleted("n")
	if r.get("n") != nil || len(r.heartbeats()) != 0 {
		t.Error("the record outlived the node and its Lease")
	}

	// A node without a Lease leaves nothing behind.
	r.ensure("m")
	r.nodeDeleted("m")
	if r.get("m") != nil {
		t.Error("a deleted node without a Lease kept its record")
	}
}

// TestNodeRecordsConcurrently: lookups from many goroutines while handlers
// make and drop records find every record made and not dropped, and the
// same record each time.
func TestNodeRecordsConcurrently(t *testing.T) {
	var r nodeRecords
	const nodes = 2000
	made := make([]*nodeRecord, nodes)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				_ = r.get(fmt.Sprint("n", (i*7+g)%nodes))
			}
		}()
	}
	for i := range nodes {
		made[i] = r.ensure(fmt.Sprint("n", i))
		if i%3 == 0 {
			r.leaseDeleted(fmt.Sprint("n", i))
		}
	}
	close(done)
	wg.Wait()
	for i := range nodes {
		got := r.get(fmt.Sprint("n", i))
		switch {
		case i%3 == 0 && got != nil:
			t.Errorf("record of n%d found after its Lease was deleted", i)
		case i%3 != 0 && got != made[i]:
			t.Errorf("record of n%d = %p, want the one made, %p", i, got, made[i])
		}
	}
	if n := len(r.heartbeats()); n != 0 {
		t.Errorf("%d heartbeats, want none (no Lease renewed)", n)
	}
}
