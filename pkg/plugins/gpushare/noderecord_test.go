package gpushare

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// TestNodeRecordsByObject: a record is found by the node object the node
// handler saw and, for any other object of the node (a snapshot older or
// newer than the handler), by name; each node is filed under one object, and
// nothing stays filed once the node goes.
func TestNodeRecordsByObject(t *testing.T) {
	var r nodeRecords
	first := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1"}}
	if r.lookup(first) != nil {
		t.Fatal("a record exists before the handler saw the node")
	}
	r.track(first)
	rec := r.get("n")
	if rec == nil || r.lookup(first) != rec || r.byObject[first] != rec {
		t.Fatalf("after track: get = %p, lookup = %p, filed = %p", rec, r.lookup(first), r.byObject[first])
	}
	updated := first.DeepCopy()
	updated.ResourceVersion = "2"
	if r.lookup(updated) != rec {
		t.Error("an object the handler has not seen did not find the node's record by name")
	}
	r.track(updated)
	if r.lookup(updated) != rec || r.lookup(first) != rec || r.get("n") != rec {
		t.Error("the update changed the node's record")
	}
	if len(r.byObject) != 1 || r.byObject[updated] != rec {
		t.Errorf("filed by object after the update: %v; want only the newest object", r.byObject)
	}
	if r.lookup(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}) != nil {
		t.Error("another node's object found n's record")
	}

	rec.renewed.Store(time.Now().UnixNano())
	r.nodeDeleted("n")
	if len(r.byObject) != 0 || r.get("n") != rec {
		t.Errorf("after the node's deletion: filed %v, record %p; want nothing filed and the heartbeat kept", r.byObject, r.get("n"))
	}
	r.track(updated)
	r.leaseDeleted("n")
	if len(r.byObject) != 0 || r.get("n") != nil || r.lookup(updated) != nil {
		t.Error("the record outlived the node's Lease")
	}
	r.track(first)
	r.nodeDeleted("n")
	if len(r.byObject) != 0 || r.get("n") != nil {
		t.Error("a deleted node without a Lease left a record")
	}
}

// TestNodeRecordsConcurrently: lookups from many goroutines while handlers
// make and drop records find every record made and not dropped, and the
// same record each time.
func TestNodeRecordsConcurrently(t *testing.T) {
	var r nodeRecords
	const nodes = 2000
	made := make([]*nodeRecord, nodes)
	objects := make([]*v1.Node, nodes)
	for i := range objects {
		objects[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("n", i)}}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var noted atomic.Int64 // records the readers found
	// What each reader found, by node: a record is made once and never
	// again, so whatever it found, by name or by object, must be that one.
	seen := make([]map[int]*nodeRecord, 8)
	for g := range seen {
		seen[g] = map[int]*nodeRecord{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			note := func(node int, rec *nodeRecord) {
				if rec == nil {
					return
				}
				noted.Add(1)
				if prev := seen[g][node]; prev != nil && prev != rec {
					t.Errorf("n%d: two records found, %p and %p", node, prev, rec)
				}
				seen[g][node] = rec
			}
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				byName, byObject := (i*7+g)%nodes, (i*5+g)%nodes
				note(byName, r.get(fmt.Sprint("n", byName)))
				note(byObject, r.lookup(objects[byObject]))
			}
		}()
	}
	for i := range nodes {
		r.track(objects[i])
		made[i] = r.ensure(fmt.Sprint("n", i))
		if i%2 == 0 {
			r.track(objects[i].DeepCopy()) // an update
		}
		if i%3 == 0 {
			r.leaseDeleted(fmt.Sprint("n", i))
		}
	}
	// On a loaded machine the readers may get no time while the handlers
	// run: let them look before stopping them, so the lookups overlap
	// something (the records made last, at least).
	deadline := time.Now().Add(10 * time.Second)
	for noted.Load() == 0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	close(done)
	wg.Wait()
	found := 0
	for g := range seen {
		for node, rec := range seen[g] {
			found++
			if rec != made[node] {
				t.Errorf("a reader found %p for n%d, not the record made, %p", rec, node, made[node])
			}
		}
	}
	if found == 0 {
		t.Error("no reader found any record: the lookups did not overlap the handlers")
	}
	for i := range nodes {
		got := r.get(fmt.Sprint("n", i))
		switch {
		case i%3 == 0 && got != nil:
			t.Errorf("record of n%d found after its Lease was deleted", i)
		case i%3 != 0 && got != made[i]:
			t.Errorf("record of n%d = %p, want the one made, %p", i, got, made[i])
		case r.lookup(objects[i]) != got:
			t.Errorf("record of n%d by its object = %p, by name %p", i, r.lookup(objects[i]), got)
		}
	}
	if want := nodes - nodes/3 - 1; len(r.byObject) != want {
		t.Errorf("%d records filed by object, want one per node left, %d", len(r.byObject), want)
	}
	if n := len(r.heartbeats()); n != 0 {
		t.Errorf("%d heartbeats, want none (no Lease renewed)", n)
	}
}
