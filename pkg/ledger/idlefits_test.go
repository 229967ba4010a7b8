package ledger_test

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/testutil"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpuinfo"
	"github.com/tessera-gpu/tessera/pkg/ledger"
)

// TestIdleFitsAnswerAsPlacing: with a pod's IdleFits, FitCurrent answers
// every node — idle ones of several kinds, a busy one, one with a card out of
// service (most of its cards), one with a card whose UUID the request
// excludes, nodes of MIG slices, static and dynamic — exactly as
// placing the pod on it does (FitCurrent without IdleFits), from Filter's 16
// goroutines at once.
func TestIdleFitsAnswerAsPlacing(t *testing.T) {
	l := ledger.New()
	var nodes []*v1.Node
	add := func(name string, inv *gpuinfo.Inventory) {
		raw := testutil.MustEncode(inv)
		if _, err := l.SetNode(inventoryNode(name, "1", raw)); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{gpuinfo.InventoryAnnotation: raw}}})
	}
	for i := range 4 {
		add(fmt.Sprint("n", i), testutil.Inventory(fmt.Sprint("n", i), "A100", 81920, 8))
	}
	for i := range 2 {
		add(fmt.Sprint("t", i), testutil.Inventory(fmt.Sprint("t", i), "T4", 16384, 4))
	}
	sick := testutil.Inventory("sick", "A100", 81920, 8)
	for i := 2; i < 8; i++ {
		sick.Cards[i].Healthy = false
	}
	add("sick", sick)
	add("busy", testutil.Inventory("busy", "A100", 81920, 8))
	// Two nodes of one MIG layout, and a dynamic one (no kind: its layout
	// changes with its pods).
	for _, name := range []string{"mig0", "mig1"} {
		add(name, testutil.MIGInventory(name, []string{"3g.20gb@0", "1g.5gb@6"}, []string{"2g.10gb@0"}, nil))
	}
	dynamic := testutil.MIGInventory("dyn", []string{}, []string{"3g.20gb@4"})
	for i := range dynamic.Cards {
		dynamic.Cards[i].MIG.Dynamic = true
	}
	add("dyn", dynamic)
	busy := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: 1000, Cores: 10}}}
	if _, err := l.Reserve(types.UID("on-busy"), "busy", orderOf(busy), busy, nil, allocator.Strategy{Policy: allocator.Binpack}); err != nil {
		t.Fatal(err)
	}

	r := rand.New(rand.NewSource(1))
	for range 200 {
		req := randomRequest(r)
		if r.Intn(3) == 0 {
			iso := []gpuinfo.Isolation{gpuinfo.OwnMIGSlice, gpuinfo.MIGSliceShare}[r.Intn(2)]
			c := gpuinfo.ContainerRequest{Name: "c", Count: 1, MemoryMiB: int64(1 + r.Intn(40000))}
			if iso == gpuinfo.OwnMIGSlice {
				c.Cores = gpuinfo.FullCores
			}
			req = &gpuinfo.PodRequest{Isolation: iso, Containers: []gpuinfo.ContainerRequest{c}}
		}
		if r.Intn(4) == 0 {
			req.Selector.ExcludeUUIDs = []string{"gpu-n1-0"}
		}
		if r.Intn(4) == 0 {
			req.Selector.Models = []string{"t4"}
		}
		st := allocator.Strategy{Policy: []allocator.Policy{allocator.Binpack, allocator.Spread}[r.Intn(2)]}
		want := map[string]allocator.Outcome{}
		for _, n := range nodes {
			out, err := l.FitCurrent(n, req, nil, st, nil)
			if err != nil {
				t.Fatal(err)
			}
			want[n.Name] = out
		}
		var idle ledger.IdleFits
		var wg sync.WaitGroup
		errs := make(chan string, 16*len(nodes))
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range nodes {
					n := nodes[(i+g)%len(nodes)]
					got, err := l.FitCurrent(n, req, nil, st, &idle)
					if diff := gocmp.Diff(want[n.Name], got); err != nil || diff != "" {
						errs <- fmt.Sprintf("node %s, request %+v: %v (-placing,+idle fits):\n%s", n.Name, req.Containers, err, diff)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatal(e)
		}
	}
}
