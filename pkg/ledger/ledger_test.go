package ledger_test

import (
	"cmp"
	"fmt"
	"math/rand"
	"slices"
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

// placed is what the test knows of a pod in the ledger.
type placed struct {
	node       string
	order      []gpuinfo.NamedContainer
	assignment *gpuinfo.Assignment
}

func randomRequest(r *rand.Rand) *gpuinfo.PodRequest {
	var req gpuinfo.PodRequest
	kinds := []gpuinfo.ContainerKind{gpuinfo.AppContainer, gpuinfo.AppContainer, gpuinfo.InitContainer, gpuinfo.SidecarContainer}
	for i, n := 0, 1+r.Intn(3); i < n; i++ {
		c := gpuinfo.ContainerRequest{Name: fmt.Sprintf("c%d", i), Kind: kinds[r.Intn(len(kinds))], Count: 1 + r.Intn(3)}
		switch r.Intn(4) {
		case 0:
			c.Cores = 100
		case 1:
			c.MemoryPercent, c.Cores = 1+int64(r.Intn(60)), int64(r.Intn(60))
		default:
			c.MemoryMiB, c.Cores = 1+int64(r.Intn(20000)), int64(r.Intn(60))
		}
		req.Containers = append(req.Containers, c)
	}
	// As kubelet starts them: init containers and sidecars before the app's.
	slices.SortStableFunc(req.Containers, func(a, b gpuinfo.ContainerRequest) int {
		return cmp.Compare(boolInt(a.Kind == gpuinfo.AppContainer), boolInt(b.Kind == gpuinfo.AppContainer))
	})
	if r.Intn(5) == 0 {
		req.Selector.ExcludeUUIDs = []string{fmt.Sprintf("gpu-n%d-%d", r.Intn(4), r.Intn(8))}
	}
	return &req
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func orderOf(req *gpuinfo.PodRequest) []gpuinfo.NamedContainer {
	var o []gpuinfo.NamedContainer
	for _, c := range req.Containers {
		o = append(o, gpuinfo.NamedContainer{Name: c.Name, Kind: c.Kind})
	}
	return o
}

func randomInventory(r *rand.Rand, node int) string {
	inv := testutil.Inventory(fmt.Sprintf("n%d", node), "NVIDIA A100", 40960, 8)
	// Cards go missing and turn unhealthy, as after hot-unplug or an XID.
	var kept []gpuinfo.Card
	for _, c := range inv.Cards {
		if r.Intn(6) == 0 {
			continue
		}
		c.Healthy = r.Intn(5) != 0
		kept = append(kept, c)
	}
	inv.Cards = kept
	return testutil.MustEncode(inv)
}

// checkAgainstReference compares every card's usage in the ledger with
// what the test's pods hold there, recomputed by the contract's rules apart
// from the ledger's code (testutil.Held) from the current inventories.
func checkAgainstReference(t *testing.T, step int, l *ledger.Ledger, inventories map[string]string, pods map[types.UID]placed) {
	t.Helper()
	capacity := map[string]map[string]testutil.Use{} // node -> uuid -> capacity
	usable := map[string][]string{}                  // node -> uuids of healthy cards not in MIG mode
	for node, raw := range inventories {
		inv, err := gpuinfo.DecodeInventory(raw)
		if err != nil {
			t.Fatal(err)
		}
		capacity[node] = map[string]testutil.Use{}
		for _, c := range inv.Cards {
			capacity[node][c.UUID] = testutil.Use{MemoryMiB: c.MemoryMiB, Cores: c.Cores}
			if c.Healthy && !c.MIGEnabled {
				usable[node] = append(usable[node], c.UUID)
			}
		}
	}
	want := map[string]testutil.Use{} // node/uuid -> held
	for _, p := range pods {
		var containers []testutil.RefContainer
		for _, c := range p.order {
			containers = append(containers, testutil.RefContainer{Name: c.Name, Init: c.Kind != gpuinfo.AppContainer, Sidecar: c.Kind == gpuinfo.SidecarContainer})
		}
		entries := map[string][]testutil.RefEntry{}
		for name, cards := range p.assignment.Containers {
			for _, c := range cards {
				entries[name] = append(entries[name], testutil.RefEntry{UUID: c.UUID, MemoryMiB: c.MemoryMiB, Cores: c.Cores})
			}
		}
		for uuid, h := range testutil.Held(containers, entries, capacity[p.node]) {
			w := want[p.node+"/"+uuid]
			want[p.node+"/"+uuid] = testutil.Use{MemoryMiB: w.MemoryMiB + h.MemoryMiB, Cores: w.Cores + h.Cores}
		}
	}
	for node, cards := range l.Snapshot() {
		for _, c := range cards {
			got := testutil.Use{MemoryMiB: c.Used.MemoryMiB, Cores: c.Used.Cores}
			if w := want[node+"/"+c.UUID]; got != w {
				t.Fatalf("step %d: node %s card %d holds %+v in the ledger, %+v by the reference", step, node, c.Index, got, w)
			}
		}
	}
	// The count of nodes by entirely free usable cards, kept as usage
	// changes, against a count from the reference.
	for count := 0; count <= 8; count++ {
		wantNodes := 0
		for node := range inventories {
			free := 0
			for _, uuid := range usable[node] {
				if want[node+"/"+uuid] == (testutil.Use{}) {
					free++
				}
			}
			if free >= count {
				wantNodes++
			}
		}
		var got int
		l.Read(func(r ledger.Reader) { got = r.NodesWithFreeCards(count) })
		if got != wantNodes {
			t.Fatalf("step %d: NodesWithFreeCards(%d) = %d, the reference counts %d", step, count, got, wantNodes)
		}
	}
}

func checkNoOvercommit(t *testing.T, step int, l *ledger.Ledger) {
	t.Helper()
	for node, cards := range l.Snapshot() {
		for _, c := range cards {
			if c.Used.MemoryMiB > c.Capacity.MemoryMiB || c.Used.Cores > c.Capacity.Cores || c.Used.MemoryMiB < 0 || c.Used.Cores < 0 {
				t.Fatalf("step %d: node %s card %d holds %+v of %+v", step, node, c.Index, c.Used, c.Capacity)
			}
		}
	}
}

// TestLedgerProperties runs 40 random sequences of 150 Reserve, Unreserve,
// bind, delete, node-add and inventory-change steps. After each step no card
// may hold more than it has, and every card's usage must equal an
// independent recomputation from the pods' assignments (checkAgainstReference);
// at the end of every sequence a ledger rebuilt from the nodes' inventories
// and the pods' assignments alone must equal the live one (both sides use
// the ledger's code: that part checks only that rebuilding loses nothing).
func TestLedgerProperties(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewSource(seed))
			l := ledger.New()
			inventories := map[string]string{}
			pods := map[types.UID]placed{}
			assumed := map[types.UID]bool{}
			var uids []types.UID
			setNode := func(i int) {
				name := fmt.Sprintf("node-%d", i)
				inventories[name] = randomInventory(r, i)
				if _, err := l.SetNode(inventoryNode(name, "", inventories[name])); err != nil {
					t.Fatal(err)
				}
			}
			setNode(0)
			for step := 0; step < 150; step++ {
				switch op := r.Intn(10); {
				case op < 5: // Reserve on a random node.
					uid := types.UID(fmt.Sprintf("pod-%d", step))
					node := fmt.Sprintf("node-%d", r.Intn(4))
					req := randomRequest(r)
					// Filter asks without a workload, Reserve places with one:
					// their answers must agree.
					policy := allocator.Policy(r.Intn(3))
					fits, err := l.Fit(node, req, nil, allocator.Strategy{Policy: policy})
					a, rerr := l.Reserve(uid, node, orderOf(req), req, nil, allocator.Strategy{Policy: policy, Workload: testWorkload, CPUFreeMilli: 4000, CPUMilli: 1000})
					if err == nil && fits.Fits != (rerr == nil) {
						t.Fatalf("step %d: Fit says %v, Reserve says %v", step, fits.Fits, rerr)
					}
					if rerr == nil {
						pods[uid] = placed{node, orderOf(req), a}
						assumed[uid] = true
						uids = append(uids, uid)
					}
				case op < 6 && len(uids) > 0: // Unreserve.
					uid := uids[r.Intn(len(uids))]
					l.ForgetAssumed(uid, pods[uid].node)
					if assumed[uid] {
						delete(pods, uid)
					}
				case op < 7 && len(uids) > 0: // The pod is bound: its annotation arrives.
					uid := uids[r.Intn(len(uids))]
					if p, ok := pods[uid]; ok {
						l.AddPod(uid, p.node, p.order, p.assignment, false)
						assumed[uid] = false
					}
				case op < 8 && len(uids) > 0: // The pod is deleted or finishes.
					uid := uids[r.Intn(len(uids))]
					l.RemovePod(uid)
					delete(pods, uid)
				default: // A node appears or its inventory changes.
					setNode(r.Intn(4))
				}
				checkNoOvercommit(t, step, l)
				checkAgainstReference(t, step, l, inventories, pods)
			}
			rebuilt := ledger.New()
			for name, raw := range inventories {
				if _, err := rebuilt.SetNode(inventoryNode(name, "", raw)); err != nil {
					t.Fatal(err)
				}
			}
			for uid, p := range pods {
				rebuilt.AddPod(uid, p.node, p.order, p.assignment, false)
			}
			if diff := gocmp.Diff(l.Snapshot(), rebuilt.Snapshot()); diff != "" {
				t.Errorf("rebuilt ledger differs (-live,+rebuilt):\n%s", diff)
			}
		})
	}
}

func TestInventoryShrinkUnderRunningPods(t *testing.T) {
	l := ledger.New()
	full := testutil.Inventory("n", "T4", 16384, 4)
	if _, err := l.SetNode(inventoryNode("n", "", testutil.MustEncode(full))); err != nil {
		t.Fatal(err)
	}
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 4, Cores: 100}}}
	a, err := l.Reserve("p", "n", orderOf(req), req, nil, allocator.Strategy{Policy: allocator.Binpack})
	if err != nil {
		t.Fatal(err)
	}
	shrunk := testutil.Inventory("n", "T4", 16384, 2)
	if _, err := l.SetNode(inventoryNode("n", "", testutil.MustEncode(shrunk))); err != nil {
		t.Fatal(err)
	}
	checkNoOvercommit(t, 0, l)
	one := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: 1}}}
	if out, _ := l.Fit("n", one, nil, allocator.Strategy{Policy: allocator.Binpack}); out.Fits {
		t.Error("a card still held by a running pod was offered after the inventory shrank")
	}
	if _, err := l.SetNode(inventoryNode("n", "", testutil.MustEncode(full))); err != nil {
		t.Fatal(err)
	}
	l.RemovePod("p")
	for _, c := range l.Snapshot()["n"] {
		if c.Used != (allocator.Usage{}) {
			t.Errorf("card %d still holds %+v after the pod left (assignment %v)", c.Index, c.Used, a.Containers)
		}
	}
}

func TestInvalidInventoryOffersNothing(t *testing.T) {
	l := ledger.New()
	changed, err := l.SetNode(inventoryNode("n", "", `{"version":1,"cards":[{"index":0,"uuid":"a","model":"T4","memoryMiB":-5,"cores":100}]}`))
	if !changed || err == nil {
		t.Fatalf("SetNode = %v, %v; want changed with an error", changed, err)
	}
	if changed, _ := l.SetNode(inventoryNode("n", "", `{"version":1,"cards":[{"index":0,"uuid":"a","model":"T4","memoryMiB":-5,"cores":100}]}`)); changed {
		t.Error("the same annotation twice reported a change")
	}
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: 1}}}
	if _, err := l.Fit("n", req, nil, allocator.Strategy{Policy: allocator.Binpack}); err == nil {
		t.Error("Fit on an invalid inventory returned no error")
	}
	if _, err := l.Fit("unknown", req, nil, allocator.Strategy{Policy: allocator.Binpack}); err != ledger.ErrNoInventory {
		t.Errorf("Fit on an unknown node = %v, want ErrNoInventory", err)
	}

	// Only nodes with a valid inventory count as having free cards, and
	// they stop counting when the inventory turns invalid or the node goes.
	freeNodes := func() (n int) {
		l.Read(func(r ledger.Reader) { n = r.NodesWithFreeCards(1) })
		return n
	}
	if got := freeNodes(); got != 0 {
		t.Errorf("NodesWithFreeCards(1) with one invalid inventory = %d, want 0", got)
	}
	valid := testutil.MustEncode(testutil.Inventory("n", "T4", 15360, 2))
	for _, step := range []struct {
		name string
		do   func()
		want int
	}{
		{"inventory valid", func() { l.SetNode(inventoryNode("n", "", valid)) }, 1},
		{"second node", func() { l.SetNode(inventoryNode("m", "", valid)) }, 2},
		{"inventory invalid", func() { l.SetNode(inventoryNode("n", "", "{")) }, 1},
		{"node deleted", func() { l.DeleteNode("m") }, 0},
	} {
		step.do()
		if got := freeNodes(); got != step.want {
			t.Errorf("after %s: NodesWithFreeCards(1) = %d, want %d", step.name, got, step.want)
		}
	}
}

func TestOlderInventoryIsIgnored(t *testing.T) {
	l := ledger.New()
	two, four := testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 2)), testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 4))
	if changed, _ := l.SetNode(inventoryNode("n", "20", four)); !changed {
		t.Fatal("first inventory not recorded")
	}
	if changed, _ := l.SetNode(inventoryNode("n", "10", two)); changed {
		t.Error("an inventory from an older node version replaced a newer one")
	}
	if got := len(l.Snapshot()["n"]); got != 4 {
		t.Errorf("%d cards recorded, want 4", got)
	}
}

// TestConcurrentFit runs the framework's 16 parallel Filter goroutines
// against writers; run it with -race.
func TestConcurrentFit(t *testing.T) {
	l := ledger.New()
	for i := 0; i < 8; i++ {
		if _, err := l.SetNode(inventoryNode(fmt.Sprint("n", i), "", testutil.MustEncode(testutil.Inventory(fmt.Sprint(i), "A100", 81920, 8)))); err != nil {
			t.Fatal(err)
		}
	}
	req := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 1, MemoryMiB: 10000, Cores: 10}}}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				_, _ = l.Fit(fmt.Sprint("n", i%8), req, nil, allocator.Strategy{Policy: allocator.Binpack})
			}
		}()
	}
	for i := 0; i < 300; i++ {
		uid := types.UID(fmt.Sprint("p", i))
		if _, err := l.Reserve(uid, fmt.Sprint("n", i%8), orderOf(req), req, nil, allocator.Strategy{Policy: allocator.Binpack}); err == nil && i%2 == 0 {
			l.RemovePod(uid)
		}
	}
	wg.Wait()
	checkNoOvercommit(t, 0, l)
}

// testWorkload is a mix of whole-card and shared requests.
var testWorkload = &allocator.Workload{Shapes: []allocator.Shape{
	{Weight: 0.4, CPUMilli: 2000, Container: gpuinfo.ContainerRequest{Count: 1, Cores: gpuinfo.FullCores}},
	{Weight: 0.1, CPUMilli: 8000, Container: gpuinfo.ContainerRequest{Count: 2, Cores: gpuinfo.FullCores}},
	{Weight: 0.3, CPUMilli: 1000, Container: gpuinfo.ContainerRequest{Count: 1, Cores: 50, MemoryPercent: 50}},
	{Weight: 0.2, CPUMilli: 1000, Container: gpuinfo.ContainerRequest{Count: 1, Cores: 25, MemoryMiB: 4096}},
}}

// inventoryNode is a node object at resourceVersion rv ("" for none) whose
// inventory annotation is raw.
func inventoryNode(name, rv, raw string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv, Annotations: map[string]string{gpuinfo.InventoryAnnotation: raw}}}
}

// TestFitCurrentKnowsStaleInventory: FitCurrent answers from the ledger only
// when it has recorded the node object's inventory annotation, by the
// object's resourceVersion or, failing that, by the annotation itself.
func TestFitCurrentKnowsStaleInventory(t *testing.T) {
	two, four := testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 2)), testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 4))
	threeCards := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 3, Cores: 100}}}
	nodeObject := func(rv string, annotations map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv, Annotations: annotations}}
	}
	for _, tc := range []struct {
		name     string
		recorded string // the annotation the ledger has, as of resourceVersion 20; "" for none
		node     *v1.Node
		wantErr  error
		wantFits bool
	}{
		{name: "same resourceVersion", recorded: four, node: nodeObject("20", map[string]string{gpuinfo.InventoryAnnotation: four}), wantFits: true},
		{name: "newer object, same annotation", recorded: four, node: nodeObject("21", map[string]string{gpuinfo.InventoryAnnotation: four}), wantFits: true},
		{name: "newer object, new annotation", recorded: two, node: nodeObject("21", map[string]string{gpuinfo.InventoryAnnotation: four}), wantErr: ledger.ErrStaleInventory},
		{name: "newer object, annotation removed", recorded: four, node: nodeObject("21", nil), wantErr: ledger.ErrStaleInventory},
		{name: "unknown node with an annotation", node: nodeObject("21", map[string]string{gpuinfo.InventoryAnnotation: four}), wantErr: ledger.ErrStaleInventory},
		{name: "unknown node without one", node: nodeObject("21", nil), wantErr: ledger.ErrNoInventory},
		{name: "recorded: too few cards", recorded: two, node: nodeObject("20", map[string]string{gpuinfo.InventoryAnnotation: two})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := ledger.New()
			if tc.recorded != "" {
				if _, err := l.SetNode(inventoryNode("n", "20", tc.recorded)); err != nil {
					t.Fatal(err)
				}
			}
			out, err := l.FitCurrent(tc.node, threeCards, nil, allocator.Strategy{Policy: allocator.Binpack}, nil)
			if err != tc.wantErr || out.Fits != tc.wantFits {
				t.Errorf("FitCurrent = fits %v, %v; want fits %v, %v", out.Fits, err, tc.wantFits, tc.wantErr)
			}
		})
	}
}

// TestFitCurrentByNodeObject: an entry filed under the node object SetNode
// recorded answers for that object, and stops answering for it as soon as a
// newer version is recorded or the node is deleted; older
// versions change nothing; another object of the recorded version is
// answered by name.
func TestFitCurrentByNodeObject(t *testing.T) {
	two, four := testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 2)), testutil.MustEncode(testutil.Inventory("n", "T4", 16384, 4))
	threeCards := &gpuinfo.PodRequest{Containers: []gpuinfo.ContainerRequest{{Name: "c", Count: 3, Cores: 100}}}
	v20, v22, v19 := inventoryNode("n", "20", four), inventoryNode("n", "22", four), inventoryNode("n", "19", two)
	l := ledger.New()
	check := func(step string, node *v1.Node, wantFits bool, wantErr error) {
		t.Helper()
		out, err := l.FitCurrent(node, threeCards, nil, allocator.Strategy{Policy: allocator.Binpack}, nil)
		if err != wantErr || out.Fits != wantFits {
			t.Errorf("%s: FitCurrent(version %s) = fits %v, %v; want fits %v, %v", step, node.ResourceVersion, out.Fits, err, wantFits, wantErr)
		}
	}
	if _, err := l.SetNode(v20); err != nil {
		t.Fatal(err)
	}
	check("recorded", v20, true, nil)
	if _, err := l.SetNode(inventoryNode("n", "21", two)); err != nil {
		t.Fatal(err)
	}
	check("a newer version recorded", v20, false, ledger.ErrStaleInventory)
	if _, err := l.SetNode(v22); err != nil {
		t.Fatal(err)
	}
	check("the newest object recorded", v22, true, nil)
	check("another object of that version", inventoryNode("n", "22", four), true, nil)
	if changed, _ := l.SetNode(v19); changed {
		t.Error("an older node object changed the ledger")
	}
	check("after an older object", v22, true, nil)
	check("the older object itself", v19, false, ledger.ErrStaleInventory)
	l.DeleteNode("n")
	check("after the node's deletion", v22, false, ledger.ErrStaleInventory)
}

func TestUsableCardsByModel(t *testing.T) {
	l := ledger.New()
	before := l.InventoryGeneration()
	inv := testutil.Inventory("a", "Tesla T4", 15360, 3)
	inv.Cards[1].Healthy = false
	inv.Cards[2].MIGEnabled = true
	if _, err := l.SetNode(inventoryNode("a", "", testutil.MustEncode(inv))); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetNode(inventoryNode("b", "", testutil.MustEncode(testutil.Inventory("b", "A100", 81920, 2)))); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetNode(inventoryNode("c", "", "{")); err == nil {
		t.Fatal("an invalid inventory was accepted")
	}
	want := map[string]int{"tesla t4": 1, "a100": 2}
	if diff := gocmp.Diff(want, l.UsableCardsByModel()); diff != "" {
		t.Errorf("usable cards by model (-want,+got):\n%s", diff)
	}
	after := l.InventoryGeneration()
	if after == before {
		t.Error("the inventory generation did not change with the inventories")
	}
	l.SetNode(inventoryNode("b", "", testutil.MustEncode(testutil.Inventory("b", "A100", 81920, 2))))
	if l.InventoryGeneration() != after {
		t.Error("the same inventory again changed the generation")
	}
	l.DeleteNode("b")
	if l.InventoryGeneration() == after {
		t.Error("deleting a node did not change the generation")
	}
}
